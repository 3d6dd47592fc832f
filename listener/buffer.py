"""Where change items wait between the websocket and the application (RFD 5 "Back pressure").

Two kinds: `MemoryBuffer` (the default) and `RedisBuffer` (a Redis list under one key). Both
keep items in arrival order; `push` answers the new length so the core can decide on overflow
(`ListenerCore.check_buffer`). Errors of redis-py become `BufferUnavailable` here and nowhere else.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

import orjson
import redis.asyncio as aioredis
import redis.exceptions

from listener.config import BufferConfig
from listener.errors import BufferUnavailable
from publisher.protocol import ChangeItem, decode_item


class Buffer(Protocol):
    """A FIFO of change items."""

    async def push(self, item: ChangeItem) -> int:
        """Append `item`; answer how many items the buffer now holds."""
        ...

    async def pop(self) -> ChangeItem | None:
        """Remove and answer the oldest item, or None when empty."""
        ...

    async def length(self) -> int:
        """How many items wait."""
        ...

    async def clear(self) -> None: ...

    async def aclose(self) -> None: ...


class MemoryBuffer:
    """Items in a deque in this process."""

    def __init__(self) -> None:
        self._items: deque[ChangeItem] = deque()

    def __len__(self) -> int:
        return len(self._items)

    async def push(self, item: ChangeItem) -> int:
        self._items.append(item)
        return len(self._items)

    async def pop(self) -> ChangeItem | None:
        return self._items.popleft() if self._items else None

    async def length(self) -> int:
        return len(self._items)

    async def clear(self) -> None:
        self._items.clear()

    async def aclose(self) -> None:
        self._items.clear()


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


def make_buffer(config: BufferConfig, instance: str) -> Buffer:
    """The buffer `config` describes, for the listener `instance`."""
    if config.kind == "redis":
        assert config.redis_url is not None  # checked by listener.config
        return RedisBuffer(config.redis_url, config.key or f"changefeed:listener:{instance}")
    return MemoryBuffer()
