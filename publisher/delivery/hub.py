"""The hub: the connections of a publisher process and the parts that serve them.

Connections are indexed (`Routes`) by (resource, sub-resource), or, when they watch only some
ids, by exact id and by id prefix, so routing an entry costs in proportion to the connections it
matches (plus one lookup per `/`-separated segment of its id where prefixes are watched). An
entry's websocket frame is built once and the same bytes are written to every matching
connection's transport, without awaiting. A connection whose transport buffer passes
`send_buffer` bytes stops being written to and catches up from the shared window in a task of its
own; if the window moves past it, it is closed with 4008 (slow consumer) -- unless it registered
with `coalesce`: then it is switched to a coalesced catch-up (publisher.delivery.coalesce) just
before the window would move past it, and closed with 4008 only when that set passes `coalesce_ids`
ids. A resuming connection (registration with `since`) first reads what it missed from Redis
(publisher.delivery.replay).

The hub composes parts that own their state: the fan-out (publisher.delivery.fanout, carrying out
publisher.delivery.decision per connection), the lagging connections (publisher.delivery.lagging),
the waiters (publisher.delivery.waiters) and the counters (publisher.delivery.counters); what it
reports is read by publisher.delivery.hub_stats.

The window's order and the cursor each entry carries are the bucket's (publisher.delivery.order):
for an ordered bucket an entry's position is its stream id and its cursor `<epoch>.<id>`; for a
bucket in a Redis Cluster each entry has a process-local position and is stamped with the
composite cursor of everything delivered up to it.

A connection that cannot be sent a gap-free history any more is closed with 4009 and one of the
reasons below, exactly as if its `since` had expired: its next registration gets `resumed: false`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import structlog

from changefeed.cursor import StreamId
from changefeed.protocol import CloseCode, close_frame
from changefeed.sse import close_chunks
from publisher.bucket import ChangeBucket, LogEntry, Vector
from publisher.delivery import fanout, replay
from publisher.delivery.counters import Counters
from publisher.delivery.decision import BEHIND, SKIP, decide
from publisher.delivery.fanout import FanOut
from publisher.delivery.lagging import Lagging
from publisher.delivery.order import order_of
from publisher.delivery.subscribers import Routes, Subscriber, Transport
from publisher.delivery.trace import TraceLog
from publisher.delivery.waiters import Waiters
from publisher.delivery.window import Window, WindowEntry

log = structlog.get_logger(__name__)

CLOSE_GRACE = 2.0
"""Seconds a congested connection gets to take its close frame before it is aborted."""

SLOW = "slow consumer: fell behind the window"
SLOW_COALESCED = "slow consumer: more than {} ids changed while it was behind"
"""4008 for a coalescing listener whose coalesced set passed `coalesce_ids`."""
RECREATED = "bucket recreated: bootstrap again"
"""4009: the bucket's epoch changed (recreated, or a new epoch after a rollback elsewhere)."""
ROLLED_BACK = "bucket rolled back: bootstrap again"
"""4009: Redis lost changes this publisher had sent; it started a new epoch."""
TRIMMED = "items trimmed before they were sent: bootstrap again"
"""4009: the log was trimmed past what this connection had been sent."""


class Hub:
    """The connections of this publisher process, and the parts that serve them: the window
    they share, the fan-out (`FanOut`), the lagging ones (`Lagging`), the waiters (`Waiters`)
    and the counters (`Counters`)."""

    def __init__(
        self, window: Window, bucket: ChangeBucket, send_buffer: int, *,
        coalesce_ids: int = 10000,
    ) -> None:
        self.window = window
        self.bucket = bucket
        self.order = order_of(bucket)
        """How the window is ordered and what cursor an entry carries (the bucket's
        capability `ordered` chooses)."""
        self.epoch = ""
        self.connections: set[Subscriber] = set()
        self.routes = Routes()
        self.counters = Counters()
        self.waiters = Waiters()
        self.lagging = Lagging(coalesce_ids, self.counters)
        self.fanout = FanOut(window, self.routes, self.lagging, self.counters, self.waiters,
                             self.order, send_buffer, catch_up=self._catch_up,
                             close_slow=self.close_slow)

    # --- membership ----------------------------------------------------------------------

    @property
    def vector(self) -> Vector:
        """Everything delivered (the window head), as a position in every shard."""
        return self.order.vector(self.epoch, self.window.head)

    def position(self, shard: int) -> StreamId:
        """What was delivered of shard `shard` (its position in `vector`)."""
        return self.order.position(shard, self.window.head)

    @property
    def trace(self) -> TraceLog | None:
        """The delivery trace the fan-out records (None: off)."""
        return self.fanout.trace

    async def start_of(self, since: str | None) -> tuple[Vector, bool]:
        """Where a registration starts, and whether that resumes `since` (see
        `replay.start_of`). Raises CursorError for a malformed `since` of an ordered bucket."""
        return await replay.start_of(self, since)

    def add(self, conn: Subscriber, start: Vector | None = None) -> None:
        """Register `conn`: live from the window head, or sent everything after `start` first
        (a resumed cursor, or a bucket head the tail has not read up to yet)."""
        self.connections.add(conn)
        self.routes.add(conn)
        if start is not None and start != self.vector:
            self.lagging.resume(conn, self.window.head)
            conn.follow(asyncio.create_task(replay.resume(self, conn, start),
                                            name=f"resume {conn.remote}"))

    def remove(self, conn: Subscriber) -> None:
        self.connections.discard(conn)
        self.lagging.discard(conn)
        self.routes.remove(conn)
        if conn.task is not None and conn.task is not asyncio.current_task():
            conn.task.cancel()

    # --- fan-out (publisher.delivery.fanout) ---------------------------------------------

    def fan_out(self, entries: Sequence[LogEntry], shard: int = 0) -> None:
        """Append new log entries of shard `shard` to the window and write them to the live
        matching connections (stamped first when the bucket has several shards:
        publisher.delivery.order)."""
        if self.order.composite:
            entries = self.order.stamp(shard, entries)
            if not entries:
                return
        self.fanout.publish(entries, self.epoch)

    def sse_of(self, entry: WindowEntry) -> bytes:
        """`entry` as a server-sent event's chunk, built once for every SSE subscriber."""
        return fanout.sse_of(entry, self.order, self.epoch)

    def _catch_up(self, conn: Subscriber) -> None:
        """`conn` fell behind (`Lagging.fall_behind`): it catches up in a task of its own."""
        conn.follow(asyncio.create_task(replay.catch_up(self, conn),
                                        name=f"catch-up {conn.remote}"))

    # --- closing -------------------------------------------------------------------------

    def close_slow(self, conn: Subscriber) -> None:
        """Close a connection that fell out of the window (or whose coalesced catch-up passed
        `coalesce_ids`) with 4008, without waiting on it."""
        if conn.closing:
            return
        coalesced = conn.coalesced
        behind = len(coalesced) if coalesced is not None else self.window.behind(conn.position)
        log.warning(
            "slow consumer closed",
            instance=conn.registration.instance,
            service=conn.registration.service,
            remote=conn.remote,
            behind=behind,
            coalesced=coalesced is not None,
        )
        reason = SLOW if coalesced is None else SLOW_COALESCED.format(coalesced.limit)
        self.close_now(conn, CloseCode.SLOW_CONSUMER, reason, "slowConsumer")

    def close_recreated(self, conn: Subscriber) -> None:
        """Close a connection whose replay found another epoch in Redis (4009)."""
        self.close_now(conn, CloseCode.BUCKET_RESET, RECREATED, "epochChange")

    def close_trimmed(self, conn: Subscriber) -> None:
        """Close a connection whose next items were trimmed before it was sent them (4009)."""
        log.warning(
            "listener closed: items trimmed before they were sent",
            instance=conn.registration.instance,
            service=conn.registration.service,
            remote=conn.remote,
            position=str(conn.position),
        )
        self.close_now(conn, CloseCode.BUCKET_RESET, TRIMMED, "trimGap")

    def close_now(self, conn: Subscriber, code: int, reason: str, cause: str | None = None) -> None:
        """Queue a close frame and drop the connection, aborting it if it cannot take the frame;
        counted under `cause` (None: not counted)."""
        if not conn.close():
            return
        if cause is not None:
            self.counters.close(cause)
        self.remove(conn)
        transport = conn.transport
        if transport.is_closing():
            return
        transport.write(close_chunks(code, reason) if conn.sse else close_frame(code, reason))
        transport.close()
        asyncio.get_running_loop().call_later(CLOSE_GRACE, transport.abort)

    # --- new histories (publisher.delivery.tail) -----------------------------------------

    def reset(self, epoch: str, base: StreamId, *, rollback: bool = False) -> None:
        """A new history (the bucket was recreated or rolled back): forget the window, start it
        at `base` and close every connection with 4009."""
        self.epoch = epoch
        self.window.reset(base)
        cause, reason = ("rollback", ROLLED_BACK) if rollback else ("epochChange", RECREATED)
        for conn in list(self.connections):
            self.close_now(conn, CloseCode.BUCKET_RESET, reason, cause)
        self.waiters.wake()

    def restart(
        self, epoch: str, heads: Sequence[StreamId], *, rollback: bool = False
    ) -> None:
        """A new history from each shard's head `heads`: every connection closed with 4009."""
        self.reset(epoch, self.order.restart(epoch, heads), rollback=rollback)

    def skip(self, shard: int, trimmed: StreamId) -> int:
        """Shard `shard` was trimmed past what the tail had read, up to `trimmed`: close every
        connection not sent past it (4009) and go on from there (`skip_to`)."""
        return self.skip_to(self.order.skipped(shard, trimmed))

    def skip_to(self, trimmed: StreamId) -> int:
        """The tail found the log trimmed past the window head: the items up to `trimmed` are
        gone unread. Close every connection that had not been sent past them (4009) and restart
        the window at `trimmed`; returns how many were closed.

        A connection resuming ahead of the tail, at or past `trimmed`, has missed nothing.
        """
        head = self.window.head
        behind = [
            c for c in self.connections
            if (head if c.live or c.coalesced is not None else c.position) < trimmed
        ]
        for conn in behind:
            self.close_now(conn, CloseCode.BUCKET_RESET, TRIMMED, "trimGap")
        self.window.reset(trimmed)
        self.waiters.wake()
        return len(behind)

    # --- waiting (publisher.delivery.waiters) --------------------------------------------

    async def wait_past(self, position: StreamId, timeout: float) -> bool:
        """Wait until the window's head passes `position` (or the bucket was recreated), at most
        `timeout` seconds; True when it did, False on time-out or shutdown.

        Long polls wait here, as catching-up connections do: one shared event, no Redis
        connection or buffer per waiting client.
        """
        return await self._wait(lambda: self.window.head > position, timeout)

    async def wait_beyond(self, heads: Sequence[StreamId], timeout: float) -> bool:
        """`wait_past` until any shard `s` was delivered past `heads[s]`."""
        return await self._wait(
            lambda: any(self.position(s) > head for s, head in enumerate(heads)), timeout
        )

    async def wait_covers(self, wanted: Vector, timeout: float) -> bool:
        """`wait_past` until everything delivered covers `wanted` (each shard's position)."""
        return await self._wait(lambda: self.vector.covers(wanted), timeout)

    async def _wait(self, done: Callable[[], bool], timeout: float) -> bool:
        epoch = self.epoch
        return await self.waiters.wait(done, lambda: self.epoch == epoch, timeout)

    def release_waiters(self) -> None:
        """Shutting down: every wait_past() returns now, and later ones at once."""
        self.waiters.release()

    # --- catching up (publisher.delivery.replay runs the loops) ---------------------------

    def wrote_one(self, conn: Subscriber, position: StreamId | None, size: int) -> None:
        """Count one item written to `conn` outside the fan-out (catching up, replaying):
        the item at window position `position` (None: replayed from a shard of a bucket in a
        Redis Cluster, at no window position)."""
        self.counters.wrote(1, size, conn.sse)
        if position is None:
            return
        conn.sent(position)
        trace = self.fanout.trace
        if trace is not None:
            trace.wrote_late(position, conn.registration.service, time.time())

    async def writable(self, conn: Subscriber) -> bool:
        """Wait until `conn`, catching up, can take another item (`decide`); False when it is
        closing."""
        transport = conn.transport
        verdict = decide(conn.written_as(), transport.is_closing(),
                         transport.get_write_buffer_size(), self.fanout.send_buffer)
        if verdict is BEHIND:
            # The transport pauses its protocol above `send_buffer` (set at registration);
            # this is aiohttp's own wait for it to drain below the low-water mark.
            await conn.protocol._drain_helper()
            return not (conn.closing or transport.is_closing())
        return verdict is not SKIP


__all__ = [
    "CLOSE_GRACE",
    "RECREATED",
    "ROLLED_BACK",
    "SLOW",
    "SLOW_COALESCED",
    "TRIMMED",
    "Hub",
    "Routes",
    "Subscriber",
    "Transport",
]
