"""What the delivery counts since start, for /changefeeds/stats and the metrics. No I/O.

Every part of the delivery counts here, through these methods; the reports only read it.
"""

from __future__ import annotations

from collections import Counter


class Counters:
    """Items written, connections closed and ended, coalesced catch-ups."""

    def __init__(self) -> None:
        self.delivered = 0
        """Items written to listeners (one per listener it went to)."""
        self.bytes_written = 0
        """Bytes of items written to listeners."""
        self.sse_delivered = 0
        """Items written to server-sent events subscribers (in `delivered` too)."""
        self.closed: Counter[str] = Counter()
        """Connections closed by the publisher, by cause (`slowConsumer`, `noPong`, ...)."""
        self.sse_ended: Counter[str] = Counter()
        """Server-sent events streams ended, by who ended them (publisher.web.sse)."""
        self.coalesced: Counter[str] = Counter()
        """Coalesced catch-ups: `started`, `finished`, `items` folded in, `sent` (one per id)."""

    def wrote(self, items: int, size: int, sse_items: int = 0) -> None:
        """`items` items of `size` bytes in all were written, `sse_items` of them as SSE."""
        self.delivered += items
        self.bytes_written += size
        self.sse_delivered += sse_items

    def close(self, cause: str) -> None:
        """A connection was closed for `cause`."""
        self.closed[cause] += 1

    def sse_end(self, by: str) -> None:
        """A server-sent events stream ended, by `by` (`listener` or `publisher`)."""
        self.sse_ended[by] += 1

    def coalescing_started(self) -> None:
        self.coalesced["started"] += 1

    def coalescing_finished(self, folded: int, sent: int) -> None:
        """A coalesced catch-up ended caught up: `folded` items folded into `sent` items."""
        self.coalesced["finished"] += 1
        self.coalesced["items"] += folded
        self.coalesced["sent"] += sent


__all__ = ["Counters"]
