"""`FleetStore`: the fleet of publishers on one bucket, each advertising a report of itself.

    {name}:publishers       sorted set: the publishers that advertised themselves, by the ms of
                            their last advertisement (an index; the reports below decide)
    {name}:publisher:<id>   string: publisher <id>'s report (JSON), expiring after its TTL

The keys are bucket-wide (hash tag ``{name}``): the same on a single Redis and a Redis Cluster.
"""

from __future__ import annotations

import time
from typing import Any

import redis.asyncio as aioredis

from publisher.bucket.redis.connection import translate_redis_errors
from publisher.bucket.values.keys import Keys


class FleetStore:
    """The reports the publishers of one bucket keep of themselves (`ChangeBucket.fleet`).

    >>> await bucket.fleet.advertise("p-1", b'{"listeners": 3}', ttl=10.0)
    >>> [id for id, report, left in await bucket.fleet.publishers()]
    ['p-1']
    """

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys

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


__all__ = ["FleetStore"]
