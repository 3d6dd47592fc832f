"""`CursorSets`: the cursor sets feed consumers store (ZeroEventHub's cursor sets).

    {name}:cursorsets:<c>    sorted set: a feed consumer's cursor set names, by last store (ms)
    {name}:cursorset:<c>:<s> hash: partition -> cursor of consumer c's set s (expires)

A consumer names a set when it reads the feed (`cursorset=`) and resumes from it later
(`resume=`); `save_cursors.lua` stores one, bounded in number per consumer and expiring. The keys
are bucket-wide (hash tag ``{name}``): the same on a single Redis and a Redis Cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis

from publisher.bucket.lua import scripts
from publisher.bucket.redis.connection import translate_redis_errors
from publisher.bucket.values.keys import Keys


class CursorSets:
    """The stored cursor sets of a bucket's feed consumers (`ChangeBucket.cursor_sets`).

    >>> await bucket.cursor_sets.save_cursors("app", "main", {0: "e.5-0"}, max_age=3600, most=8)
    True
    >>> await bucket.cursor_sets.load_cursors("app", "main", [0, 1])
    {0: 'e.5-0', 1: None}
    """

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys
        self._save_cursors = client.register_script(scripts.SAVE_CURSORS.text)

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
        """The cursor the consumer's `cursorset` holds for each of `partitions` (None where it
        holds none: an expired set holds none)."""
        async with translate_redis_errors("cursorset"):
            values: Any = await self.redis.hmget(
                self.keys.cursorset(consumer, cursorset), [str(p) for p in partitions]
            )
        return {p: v.decode() if v else None for p, v in zip(partitions, values, strict=True)}


__all__ = ["CursorSets"]
