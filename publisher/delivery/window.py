"""The fan-out window: one bounded run of the newest log entries, shared by every connection.

No connection has a queue of its own. A connection that keeps up is written to as items arrive;
one that falls behind keeps only a position in this window and catches up from it. Pure code.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from operator import attrgetter

from changefeed.cursor import StreamId

_position = attrgetter("position")


@dataclass(slots=True, eq=False)
class WindowEntry:
    """A log entry, encoded once for every connection."""

    position: StreamId
    resource: str
    sub_resources: tuple[str, ...]
    changed_resource_id: str
    payload: bytes
    """The change item as JSON."""
    frame: bytes = field(repr=False)
    """The payload as a complete websocket text frame."""
    sse: bytes | None = field(default=None, repr=False)
    """The payload as a server-sent event's HTTP chunk, built by the first SSE subscriber
    written to (publisher.delivery.fanout.sse_of): websocket-only fan-out never pays for it."""
    cursor: str | None = field(default=None, repr=False)
    """The cursor the entry was stamped with (`publisher.delivery.order.Stamped`); None when it
    is built from the position (`TotalOrder`)."""
    published: int | None = field(default=None, repr=False)
    """The commit's Redis time (ms) when the position is not its stream id (`Stamped`)."""

    def sse_chunk(self, chunk: bytes) -> bytes:
        """Keep `chunk`, the payload as a server-sent event's chunk, for every SSE subscriber."""
        self.sse = chunk
        return chunk


class Window:
    """The newest `capacity` entries after position `base`, oldest first.

    Every entry after `base` up to `head` is in the window (it covers `(base, head]`).
    """

    def __init__(self, capacity: int, base: StreamId) -> None:
        if capacity < 1:
            raise ValueError("window capacity must be >= 1")
        self.capacity = capacity
        self._entries: list[WindowEntry] = []
        self._start = 0
        self.base = base
        self.head = base

    def __len__(self) -> int:
        return len(self._entries) - self._start

    def reset(self, base: StreamId) -> None:
        """Forget every entry (the bucket was recreated); the window covers (base, base]."""
        self._entries = []
        self._start = 0
        self.base = self.head = base

    def append(self, entry: WindowEntry) -> None:
        if entry.position <= self.head:
            raise ValueError(f"window entries must be appended in order: {entry.position}")
        self._entries.append(entry)
        self.head = entry.position
        if len(self) > self.capacity:
            self.base = self._entries[self._start].position
            self._start += 1
            if self._start >= self.capacity:
                del self._entries[: self._start]
                self._start = 0

    def oldest(self) -> WindowEntry | None:
        """The entry the next append drops when the window is full (None when empty)."""
        return self._entries[self._start] if len(self) else None

    def covers(self, position: StreamId) -> bool:
        """True when every entry after `position` (up to head) is still in the window."""
        return position >= self.base

    def after(self, position: StreamId) -> list[WindowEntry]:
        """The entries after `position`, oldest first (a snapshot: the window may move on)."""
        index = bisect.bisect_right(self._entries, position, lo=self._start, key=_position)
        return self._entries[index:]

    def behind(self, position: StreamId) -> int:
        """How many window entries are after `position`."""
        return len(self._entries) - bisect.bisect_right(
            self._entries, position, lo=self._start, key=_position
        )
