"""Where change items wait between the websocket and the application (RFD 5 "Back pressure").

Two kinds: `MemoryBuffer` (the default) and `RedisBuffer` (a Redis list under one key). Both
keep items in arrival order; `push` answers the new length so the core can decide on overflow
(`ListenerCore.check_buffer`). `RedisBuffer` lives in `listener.redis_buffer`, imported only
when a Redis buffer is configured.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from changefeed.protocol import ChangeItem
from listener.config import BufferConfig


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


def make_buffer(config: BufferConfig, instance: str) -> Buffer:
    """The buffer `config` describes, for the listener `instance`."""
    if config.kind == "redis":
        assert config.redis_url is not None  # checked by listener.config
        from listener.redis_buffer import RedisBuffer  # only a Redis buffer needs redis-py

        return RedisBuffer(config.redis_url, config.key or f"changefeed:listener:{instance}")
    return MemoryBuffer()
