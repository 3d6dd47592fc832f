"""`ChangeBucket`: the change bucket and the authoritative store, in Redis.

A bucket is a set of shards (`publisher.bucket.shard`), each a slot-local log with one id
sequence whose scripts (commit, tail, read, retention, trim, page) run on one Redis; which shards
a bucket has is decided from its client by `publisher.bucket.layout`, and nowhere else:

- a single Redis or a Sentinel-managed Redis: one shard holding every partition (they share one
  id sequence): the bucket is `ordered`, a total order of its items, and its cursor is
  ``<epoch>.<id>``;
- a Redis Cluster: one shard per partition, each under its own hash tag ``{name/p}`` with its own
  sequence, spread over the masters by slot; a position is one id per shard, its cursor
  composite. A commit over several partitions is one atomic commit per shard (concurrently):
  when one fails after another was written, `CommitOutcomeUnknown` (or the refusal's error)
  says which partitions were written; idempotency keys are per shard (`key/p`); the bucket's
  epoch lives in ``{name}:epoch`` and each shard keeps a copy its scripts check.

What belongs to the whole bucket stays under ``{name}`` (`keys`): its epoch and partition count,
the fleet's reports, feed cursor sets, Spark ledgers and durable consumers.

`commit` writes the state and appends the item in one Lua script, so the store and the bucket
never disagree. `trim` removes items older than maxAge and records the horizon; it is idempotent,
so every publisher on a bucket may run it. redis-py's errors become ours in
`publisher.bucket.connection` and nowhere else.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis.exceptions

from changefeed.protocol import Resource
from publisher.bucket.cluster_url import is_cluster_url
from publisher.bucket.commits import StreamStats
from publisher.bucket.connection import POOL_SIZE, POOL_TIMEOUT, connect, translate_redis_errors
from publisher.bucket.core import IDEMPOTENCY_KEYS
from publisher.bucket.layout import Settings
from publisher.bucket.reads import BucketReads
from publisher.bucket.writes import (
    BATCH,
    REPLICAS_TIMEOUT,
    Batch,
    BucketWrites,
    EncodedBatch,
    KeyOf,
)


class ChangeBucket(BucketWrites, BucketReads):
    """Commits changes, reads the log and the store, and trims: one bucket, in a single Redis,
    a Sentinel-managed Redis or a Redis Cluster (the client says which: see the module's
    docstring). Its commit path is `BucketWrites`, its reads `BucketReads`, its shards and epoch
    `BucketCore`.

    `partitions` is the partition count the bucket must have (the configured one); None accepts
    whatever the bucket was created with (1 for a new bucket). `idempotency_keys` bounds how many
    idempotency keys the bucket remembers.

    >>> bucket = ChangeBucket(connect("redis://127.0.0.1:6379/0"), "changefeed", resources)
    >>> cursor = await bucket.commit("vm", vm_uuid, ["nic"], state, key=request_id)
    """

    # --- cursors stored for feed consumers -------------------------------------------------

    async def save_cursors(
        self,
        consumer: str,
        cursorset: str,
        cursors: Mapping[int, str],
        *,
        max_age: float,
        most: int,
    ) -> bool:
        """Store `cursors` in the consumer's `cursorset`, which then lives `max_age` seconds.
        False (nothing stored) when that is a new set and the consumer has `most` already."""
        if not cursors:
            return True
        args: list[Any] = [cursorset, max(1, int(max_age * 1000)), most]
        for partition, cursor in cursors.items():
            args += [partition, cursor]
        async with translate_redis_errors("cursorset"):
            stored = await self._save_cursors(
                keys=[self.keys.cursorsets(consumer), self.keys.cursorset(consumer, cursorset)],
                args=args,
            )
        return bool(stored)

    async def load_cursors(
        self, consumer: str, cursorset: str, partitions: Sequence[int]
    ) -> dict[int, str | None]:
        async with translate_redis_errors("cursorset"):
            values: Any = await self.redis.hmget(
                self.keys.cursorset(consumer, cursorset), [str(p) for p in partitions]
            )
        return {p: v.decode() if v else None for p, v in zip(partitions, values, strict=True)}

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


    # --- the fleet: publishers advertising themselves ---------------------------------------

    async def advertise(self, publisher_id: str, report: bytes, ttl: float) -> None:
        """Store `report` as publisher `publisher_id`'s, living `ttl` seconds unless renewed.

        The index of publishers forgets an id ten TTLs after its last advertisement (by this
        host's clock); `publishers()` drops earlier whoever's report has expired.
        """
        now_ms = int(time.time() * 1000)
        ttl_ms = max(int(ttl * 1000), 1)
        async with translate_redis_errors("advertise"):
            pipe = self.redis.pipeline(transaction=True)
            pipe.set(self.keys.publisher(publisher_id), report, px=ttl_ms)
            pipe.zadd(self.keys.publishers, {publisher_id: now_ms})
            pipe.zremrangebyscore(self.keys.publishers, "-inf", now_ms - 10 * ttl_ms)
            await pipe.execute()

    async def withdraw(self, publisher_id: str) -> None:
        """Remove publisher `publisher_id`'s report at once (it stops cleanly)."""
        async with translate_redis_errors("withdraw"):
            pipe = self.redis.pipeline(transaction=True)
            pipe.delete(self.keys.publisher(publisher_id))
            pipe.zrem(self.keys.publishers, publisher_id)
            await pipe.execute()

    async def publishers(self) -> list[tuple[str, bytes, float]]:
        """Every live publisher's (id, report, seconds its report has left to live), by id."""
        async with translate_redis_errors("publishers"):
            ids: Any = await self.redis.zrange(self.keys.publishers, 0, -1)
            names = sorted(i.decode() for i in ids)
            if not names:
                return []
            pipe = self.redis.pipeline(transaction=False)
            for name in names:
                pipe.get(self.keys.publisher(name))
                pipe.pttl(self.keys.publisher(name))
            replies = await pipe.execute()
            out = []
            gone = []
            for i, name in enumerate(names):
                report, left_ms = replies[2 * i], replies[2 * i + 1]
                if report is None:
                    gone.append(name)
                else:
                    out.append((name, bytes(report), max(int(left_ms), 0) / 1000))
            if gone:
                await self.redis.zrem(self.keys.publishers, *gone)
        return out


    async def aclose(self) -> None:
        for shard in self._shards:
            await shard.aclose()
        await self.redis.aclose()


def open_bucket(
    source: str | Settings,
    name: str | None = None,
    resources: Iterable[Resource] | None = None,
    partitions: int | None = None,
    *,
    tail: bool = False,
    pool_size: int = POOL_SIZE,
    pool_timeout: float = POOL_TIMEOUT,
) -> ChangeBucket:
    """The bucket of a Redis URL (any kind: plain, Sentinel, Redis Cluster), or of a loaded
    config (`publisher.config.Config`: its `bucket` section and resources; `name`, `resources`
    and `partitions` then come from it).

    `tail`: a client for a tail's blocking reads, with a connection of its own per shard, so that
    a blocking read never waits behind requests, nor they on it.

    >>> bucket = open_bucket("redis+cluster://10.0.0.1:7000/", "changefeed", resources, 16)
    >>> bucket = open_bucket(config)
    """
    if isinstance(source, str):
        url = source
    else:
        settings = source.bucket
        if settings.redis_url is None:
            raise ValueError("open_bucket: the config has no bucket URL (no embedded Redis yet)")
        url, name, resources = settings.redis_url, settings.name, source.resources
        partitions, pool_size = settings.partitions, settings.pool_size
        pool_timeout = getattr(settings, "pool_timeout", pool_timeout)
    if name is None:
        raise ValueError("open_bucket: a bucket name is needed with a URL")
    if tail:
        pool_size = (partitions or 1) + 2 if is_cluster_url(url) else 2
    client = connect(url, blocking=tail, pool_size=pool_size, pool_timeout=pool_timeout)
    return ChangeBucket(client, name, resources, partitions)


__all__ = [
    "BATCH",
    "IDEMPOTENCY_KEYS",
    "REPLICAS_TIMEOUT",
    "Batch",
    "ChangeBucket",
    "EncodedBatch",
    "KeyOf",
    "StreamStats",
    "open_bucket",
]
