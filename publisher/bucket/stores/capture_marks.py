"""`CaptureMarks`: what the capture (publisher.capture) keeps in the bucket of each slot.

    {name}:capture:<slot>        hash: epoch (the bucket epoch the slot's tables were copied in),
                                 lsn (the slot's consistent point the copy was taken at), head
                                 (the log's head after the copy: the stream's changes come
                                 after it), at (ms of the copy)
    {name}:capture:<slot>:aside  list: the rows set aside (JSON, newest first, the newest
                                 MAX_SET_ASIDE kept)

A slot whose mark is missing, or names another epoch than the bucket's, has no copy in this
bucket that its stream continues: the capture makes a new slot and copies the tables again. The
keys are bucket-wide (hash tag ``{name}``): the same on a single Redis and a Redis Cluster. Self-
contained: it uses the bucket's client, its key names and its one error translation;
`before_commit` reads the idempotency hash of an ordered bucket (so that a transaction the slot
sends again is known applied before it is planned against the state it left).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from publisher.bucket.redis.connection import translate_redis_errors
from publisher.bucket.values.keys import Keys

MAX_SET_ASIDE = 1000
"""Set-aside rows kept per slot (older ones are forgotten; the log lines keep every one)."""


@dataclass(frozen=True, slots=True)
class Mark:
    """The copy a slot's stream continues."""

    epoch: str
    lsn: int
    head: str
    """The log's head after the copy ('ms-seq' of the first shard; '' when empty)."""
    at: int
    """When the copy ended (ms since the epoch of Unix)."""


class CaptureMarks:
    """The capture's marks and set-aside rows in bucket `name` (its client `client`).

    >>> marks = CaptureMarks(bucket.redis, bucket.name)
    >>> await marks.write("changefeed_vmapi", epoch, lsn, "1700000000000-5")
    >>> (await marks.read("changefeed_vmapi")).lsn == lsn
    True
    """

    def __init__(self, client: aioredis.Redis, name: str) -> None:
        self.redis = client
        self._prefix = "{" + name + "}:capture:"
        self._idempotency = Keys(name).idempotency

    async def read(self, slot: str) -> Mark | None:
        async with translate_redis_errors("capture mark"):
            found: Any = await self.redis.hgetall(self._prefix + slot)
        if not found or b"epoch" not in found:
            return None
        return Mark(found[b"epoch"].decode(), int(found[b"lsn"]),
                    found.get(b"head", b"").decode(), int(found.get(b"at", 0)))

    async def write(self, slot: str, epoch: str, lsn: int, head: str) -> Mark:
        """Mark the copy of `slot` (at consistent point `lsn`, the log's head `head` after it)
        as the one its stream continues."""
        made = Mark(epoch, lsn, head, int(time.time() * 1000))
        mark = {"epoch": epoch, "lsn": str(lsn), "head": head, "at": str(made.at)}
        async with translate_redis_errors("capture mark"):
            await self.redis.hset(self._prefix + slot, mapping=mark)  # type: ignore[arg-type]
        return made

    async def forget(self, slot: str) -> None:
        async with translate_redis_errors("capture mark"):
            await self.redis.delete(self._prefix + slot)

    async def before_commit(self, slot: str, keys: list[str]) -> tuple[bool, list[bool]]:
        """Whether `slot`'s mark is still there (else Redis lost it: copy again), and for each
        idempotency key of `keys` whether a commit under it is in this (ordered) bucket (the
        one shard's idempotency hash, `{name}:idem`, holds it): one round trip."""
        async with translate_redis_errors("capture mark"), \
                self.redis.pipeline(transaction=False) as pipe:
            pipe.exists(self._prefix + slot)
            if keys:  # one HMGET of every key, not one command each
                pipe.hmget(self._idempotency, keys)
            marked, *found = await pipe.execute()
        known = found[0] if found else []
        return bool(marked), [k is not None for k in known]

    async def set_aside(self, slot: str, rows: list[bytes]) -> None:
        """Keep `rows` (JSON each) as the newest set-aside rows of `slot`."""
        key = self._prefix + slot + ":aside"
        async with translate_redis_errors("capture set-aside rows"), \
                self.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(key, *rows)
            pipe.ltrim(key, 0, MAX_SET_ASIDE - 1)
            await pipe.execute()

    async def aside(self, slot: str, count: int = 100) -> list[bytes]:
        """The newest `count` set-aside rows of `slot`, newest first."""
        async with translate_redis_errors("capture set-aside rows"):
            found: Any = await self.redis.lrange(self._prefix + slot + ":aside", 0, count - 1)
        return list(found)
