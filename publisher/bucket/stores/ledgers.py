"""`SparkLedgers`: what the Spark writers of one bucket recorded as committed.

    {name}:spark:<query>    hash: the micro-batches a Spark streaming query committed
    {name}:sparktxn:<app>   string: "<version> <count> <first cursor> <last cursor>", the
                            newest version a Spark job of txnAppId <app> committed (expires)

A streaming query's ledger makes a micro-batch that Spark runs again (after a failure) a no-op; a
batch job's record does the same for a `txnVersion` it wrote already. The keys are bucket-wide
(hash tag ``{name}``): the same on a single Redis and a Redis Cluster.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from publisher.bucket.redis.connection import translate_redis_errors
from publisher.bucket.values.keys import Keys


class SparkLedgers:
    """The micro-batch ledgers and txn records of the Spark writers (`ChangeBucket.ledgers`).

    >>> await bucket.ledgers.record_batch("nightly", 7, summary, retain=1000)
    >>> await bucket.ledgers.batch_recorded("nightly", 7) == summary
    True
    """

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys

    # --- the micro-batches of Spark streaming writers ----------------------------------------

    async def batch_recorded(self, writer: str, batch: int) -> str | None:
        """What `writer` recorded for micro-batch `batch` when it committed it, or None."""
        async with translate_redis_errors("spark ledger"):
            summary: Any = await self.redis.hget(self.keys.ledger(writer), str(batch))
        return summary.decode() if summary is not None else None

    async def ledger(self, writer: str) -> dict[int, str]:
        """Every micro-batch `writer` recorded (batch id -> what it recorded)."""
        async with translate_redis_errors("spark ledger"):
            entries: Any = await self.redis.hgetall(self.keys.ledger(writer))
        return {int(batch): summary.decode() for batch, summary in entries.items()}

    async def record_batch(
        self, writer: str, batch: int, summary: str, retain: int, ttl_ms: int | None = None
    ) -> None:
        """Record micro-batch `batch` of `writer` as committed (the first record stays) and
        forget the one `retain` batches older; with `ttl_ms`, the whole record expires that long
        after its newest micro-batch."""
        ledger = self.keys.ledger(writer)
        async with (
            translate_redis_errors("spark ledger"),
            self.redis.pipeline(transaction=True) as pipe,
        ):
            pipe.hsetnx(ledger, str(batch), summary)
            if batch >= retain:
                pipe.hdel(ledger, str(batch - retain))
            if ttl_ms is not None:
                pipe.pexpire(ledger, ttl_ms)
            await pipe.execute()

    # --- the versions of Spark batch jobs (txnAppId, txnVersion) -----------------------------

    async def txn_record(self, app_id: str) -> str | None:
        """The record of the newest version a Spark job of `app_id` committed
        ("<version> <summary>"), or None (never, or expired)."""
        async with translate_redis_errors("spark txn"):
            record: Any = await self.redis.get(self.keys.txn(app_id))
        return record.decode() if record is not None else None

    async def record_txn(self, app_id: str, version: int, summary: str, ttl_ms: int) -> str:
        """Record `version` of `app_id` as committed ("<version> <summary>"), expiring after
        `ttl_ms`, unless a version as high is recorded; returns the record that stands.

        A check-and-set (WATCH, MULTI): a concurrent record makes it look again."""
        key = self.keys.txn(app_id)
        record = f"{version} {summary}"
        async with translate_redis_errors("spark txn"), self.redis.pipeline() as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    known: Any = await pipe.get(key)
                    if known is not None:
                        found = known.decode()
                        number = found.partition(" ")[0]
                        if number.isdigit() and int(number) >= version:
                            return str(found)
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.set(key, record, px=ttl_ms)
                    await pipe.execute()
                    return record
                except redis.exceptions.WatchError:
                    continue


__all__ = ["SparkLedgers"]
