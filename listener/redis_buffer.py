"""The listener's Redis buffer: items wait in a Redis list, so they survive a restart of the
application. Its own module so that `import listener` does not import redis-py; errors of
redis-py become `BufferUnavailable` here and nowhere else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
import redis.asyncio as aioredis
import redis.exceptions

from changefeed.errors import BufferUnavailable
from changefeed.protocol import ChangeItem, decode_item


@asynccontextmanager
async def _translate(what: str) -> AsyncIterator[None]:
    try:
        yield
    except (redis.exceptions.RedisError, OSError) as exc:
        raise BufferUnavailable(f"Redis buffer: {what} failed ({exc})", exc) from exc


class RedisBuffer:
    """Items as JSON in a Redis list under `key` (RPUSH to append, LPOP to take)."""

    def __init__(self, url: str, key: str) -> None:
        self.key = key
        self._redis = aioredis.Redis.from_url(url)

    async def push(self, item: ChangeItem) -> int:
        async with _translate("push"):
            return int(await self._redis.rpush(self.key, item.encode()))

    async def pop(self) -> ChangeItem | None:
        async with _translate("pop"):
            data: bytes | None = await self._redis.lpop(self.key)  # type: ignore[assignment]
        if data is None:
            return None
        return decode_item(orjson.loads(data))

    async def length(self) -> int:
        async with _translate("length"):
            return int(await self._redis.llen(self.key))

    async def clear(self) -> None:
        async with _translate("clear"):
            await self._redis.delete(self.key)

    async def aclose(self) -> None:
        await self._redis.aclose()


__all__ = ["RedisBuffer"]
