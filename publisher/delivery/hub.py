"""Fan-out: route each new log entry to the connections registered for its change kind.

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
(publisher.delivery.replay). Several entries at once are routed and written by
publisher.delivery.fanout; what the hub reports is read by publisher.delivery.hub_stats.

The window's order and the cursor each entry carries are the bucket's (publisher.delivery.order):
for an ordered bucket an entry's position is its stream id and its cursor `<epoch>.<id>`; for a
bucket in a Redis Cluster each entry has a process-local position and is stamped with the
composite cursor of everything delivered up to it.

A connection that cannot be sent a gap-free history any more is closed with 4009 and one of the
reasons below, exactly as if its `since` had expired: its next registration gets `resumed: false`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import structlog

from changefeed.cursor import StreamId
from changefeed.protocol import (
    CloseCode,
    close_frame,
    text_frame,
)
from changefeed.sse import change_chunk, close_chunks
from publisher.bucket import ChangeBucket, LogEntry, Vector
from publisher.delivery import fanout, hub_stats, replay
from publisher.delivery.coalesce import CoalesceOverflow
from publisher.delivery.order import StampedEntry, order_of
from publisher.delivery.subscribers import Routes, Subscriber, Transport
from publisher.delivery.trace import TraceLog
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
    """The connections of this publisher process and the window they share."""

    def __init__(
        self, window: Window, bucket: ChangeBucket, send_buffer: int, *,
        coalesce_ids: int = 10000,
    ) -> None:
        self.window = window
        self.bucket = bucket
        self.order = order_of(bucket)
        """How the window is ordered and what cursor an entry carries (the bucket's
        capability `ordered` chooses)."""
        self.send_buffer = send_buffer
        self.coalesce_ids = coalesce_ids
        """The bound of a coalesced catch-up's set (`limits.coalesceIds`)."""
        self._coalescible: set[Subscriber] = set()
        """Lagging connections registered with `coalesce`, catching up from the window: each
        is switched to a coalesced catch-up before the window moves past it."""
        self.coalesced: Counter[str] = Counter()
        """Coalesced catch-ups since start: `started`, `finished`, `items` folded in, `sent`
        (one per id), for stats and metrics."""
        self.epoch = ""
        self.connections: set[Subscriber] = set()
        self.routes = Routes()
        self._lagging: set[Subscriber] = set()
        self._advanced = asyncio.Event()
        self.waiting = 0
        """Long polls waiting for the window to advance now (a gauge for stats and metrics)."""
        self.waits = 0
        """Waits begun since start: a poll that woke, found nothing for it and waits again
        counts twice."""
        self.released = False
        self.heads: tuple[StreamId, ...] = (window.head,)
        """Each shard's head at the tail's last read of it."""
        self.unread = 0
        """Log entries after the window head at the tail's last read (items it is behind)."""
        self.closed: Counter[str] = Counter()
        """Connections closed because their history broke, by cause (for stats)."""
        self.delivered = 0
        """Items written to listeners since start (one per listener it went to)."""
        self.bytes_written = 0
        """Bytes of items written to listeners since start."""
        self.observe_latency: Callable[[float], None] | None = None
        """Called once per new item written to at least one live listener, with the seconds
        from its commit (its Redis time) to the write: the metrics' histogram."""
        self.trace: TraceLog | None = None
        """The delivery trace (publisher.delivery.trace), None when `trace.items` is 0."""
        self.sse_delivered = 0
        """Items written to server-sent events subscribers since start (in `delivered` too)."""
        self.sse_ended: Counter[str] = Counter()
        """Server-sent events streams ended since start, by who ended them (publisher.web.sse)."""

    # --- membership ----------------------------------------------------------------------

    @property
    def vector(self) -> Vector:
        """Everything delivered (the window head), as a position in every shard."""
        return self.order.vector(self.epoch, self.window.head)

    def position(self, shard: int) -> StreamId:
        """What was delivered of shard `shard` (its position in `vector`)."""
        return self.order.position(shard, self.window.head)

    @property
    def log_head(self) -> StreamId:
        """The newest shard head at the tail's last reads (an ordered bucket's head)."""
        return max(self.heads)

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
            conn.live = False
            conn.replaying = True  # not closed as slow while it replays from Redis
            conn.position = self.window.head
            self._lagging.add(conn)
            conn.task = asyncio.create_task(replay.resume(self, conn, start),
                                            name=f"resume {conn.remote}")

    def remove(self, conn: Subscriber) -> None:
        self.connections.discard(conn)
        self._lagging.discard(conn)
        self._coalescible.discard(conn)
        self.routes.remove(conn)
        if conn.task is not None and conn.task is not asyncio.current_task():
            conn.task.cancel()

    # --- fan-out -------------------------------------------------------------------------

    def encode(self, entry: LogEntry) -> WindowEntry:
        payload = entry.item(self.epoch).encode()
        if isinstance(entry, StampedEntry):
            return WindowEntry(
                entry.position, entry.resource, entry.sub_resources,
                entry.changed_resource_id, payload, text_frame(payload),
                cursor=entry.cursor, published=entry.published,
            )
        return WindowEntry(
            entry.position,
            entry.resource,
            entry.sub_resources,
            entry.changed_resource_id,
            payload,
            text_frame(payload),
        )

    def cursor_of(self, entry: WindowEntry) -> str:
        """The cursor `entry` carries."""
        return self.order.cursor(self.epoch, entry.position, entry.cursor)

    def sse_of(self, entry: WindowEntry) -> bytes:
        """`entry` as a server-sent event's chunk, built once for every SSE subscriber."""
        chunk = entry.sse
        if chunk is None:
            chunk = entry.sse = change_chunk(self.cursor_of(entry), entry.payload)
        return chunk

    def fan_out(self, entries: Sequence[LogEntry], shard: int = 0) -> None:
        """Append new log entries to the window and write them to live matching connections:
        one entry by `_publish_one`, several by publisher.delivery.fanout (one write per
        connection for all of them). `entries` are of shard `shard`: stamped first when the
        bucket has several (publisher.delivery.order).
        """
        if self.order.composite:
            entries = self.order.stamp(shard, entries)
            if not entries:
                return
        if len(entries) == 1:
            self._publish_one(entries[0])
            return
        fanout.publish_batch(self, entries)

    def _publish_one(self, raw: LogEntry) -> None:
        """`fan_out` of one entry (a tail read of one commit, the common case): each matching
        connection is written its frame at once, with no per-connection bookkeeping beyond a
        list of whom it was written to when the delivery trace is on."""
        window = self.window
        previous = window.head
        overflowed: list[Subscriber] = []
        if raw.position > previous:
            entry = self.encode(raw)
            if self._coalescible and len(window) >= window.capacity:
                fanout.coalesce_before(self, window.oldest())
            window.append(entry)
            trace = self.trace
            read_at = time.time() if trace is not None else 0.0
            written: list[Subscriber] | None = [] if trace is not None else None
            send_buffer = self.send_buffer
            frame = entry.frame
            delivered = sent = sse_sent = 0
            for conn in self.routes.matching(
                entry.resource, entry.sub_resources, entry.changed_resource_id
            ):
                if not conn.live:
                    if conn.coalesced is not None and not self._folded(conn, entry):
                        overflowed.append(conn)
                    continue
                transport = conn.transport
                if transport.is_closing():
                    continue
                if transport.get_write_buffer_size() > send_buffer:
                    self._fall_behind(conn, previous)
                    continue
                if conn.sse:
                    data = self.sse_of(entry)
                    sse_sent += 1
                else:
                    data = frame
                transport.write(data)
                conn.last_sent = entry.position
                delivered += 1
                sent += len(data)
                if written is not None:
                    written.append(conn)
            if trace is not None:
                assert written is not None
                trace.published_one(self.epoch, entry.position, written, read_at, time.time())
            if delivered:
                self.delivered += delivered
                self.bytes_written += sent
                self.sse_delivered += sse_sent
                if self.observe_latency is not None:
                    committed = entry.published or entry.position.ms
                    self.observe_latency(max(time.time() * 1000 - committed, 0.0) / 1000)
        self._published(overflowed)

    def _published(self, overflowed: Iterable[Subscriber]) -> None:
        """After a publish: close the coalescing connections whose catch-up overflowed and the
        lagging ones the window has moved past, then wake whoever waits for the window."""
        for conn in overflowed:
            self.close_slow(conn)
        if self._lagging:
            window = self.window
            fallen = [c for c in self._lagging if not c.replaying and not window.covers(c.position)]
            for conn in fallen:
                self.close_slow(conn)
        self._wake()

    @staticmethod
    def _folded(conn: Subscriber, entry: WindowEntry) -> bool:
        """Fold `entry` into `conn`'s coalesced catch-up; False when that passed its limit (the
        caller closes it once the batch is written)."""
        if conn.closing or conn.coalesced is None:
            return True
        try:
            conn.coalesced.fold(entry.resource, entry.sub_resources, entry.changed_resource_id,
                                entry.position, entry.cursor, entry.published)
        except CoalesceOverflow:
            return False
        return True

    def _wake(self) -> None:
        self._advanced.set()
        self._advanced = asyncio.Event()

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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        epoch = self.epoch
        self.waits += 1
        self.waiting += 1
        try:
            while not done() and self.epoch == epoch:
                remaining = deadline - loop.time()
                if self.released or remaining <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._advanced.wait(), remaining)
            return True
        finally:
            self.waiting -= 1

    def release_waiters(self) -> None:
        """Shutting down: every wait_past() returns now, and later ones at once."""
        self.released = True
        self._wake()

    def _fall_behind(self, conn: Subscriber, position: StreamId) -> None:
        conn.live = False
        conn.position = position
        self._lagging.add(conn)
        if conn.registration.coalesce and not conn.sse and not conn.replaying:
            self._coalescible.add(conn)
        conn.task = asyncio.create_task(replay.catch_up(self, conn),
                                        name=f"catch-up {conn.remote}")

    def close_slow(self, conn: Subscriber) -> None:
        """Close a connection that fell out of the window (or whose coalesced catch-up passed
        `coalesce_ids`) with 4008, without waiting on it."""
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
        self.closed["slowConsumer"] += 1
        reason = SLOW if coalesced is None else SLOW_COALESCED.format(coalesced.limit)
        self.close_now(conn, CloseCode.SLOW_CONSUMER, reason)

    def close_recreated(self, conn: Subscriber) -> None:
        """Close a connection whose replay found another epoch in Redis (4009)."""
        self.closed["epochChange"] += 1
        self.close_now(conn, CloseCode.BUCKET_RESET, RECREATED)

    def close_trimmed(self, conn: Subscriber) -> None:
        """Close a connection whose next items were trimmed before it was sent them (4009)."""
        log.warning(
            "listener closed: items trimmed before they were sent",
            instance=conn.registration.instance,
            service=conn.registration.service,
            remote=conn.remote,
            position=str(conn.position),
        )
        self.closed["trimGap"] += 1
        self.close_now(conn, CloseCode.BUCKET_RESET, TRIMMED)

    def close_now(self, conn: Subscriber, code: int, reason: str) -> None:
        """Queue a close frame and drop the connection, aborting it if it cannot take the frame."""
        if conn.closing:
            return
        conn.closing = True
        self.remove(conn)
        transport = conn.transport
        if transport.is_closing():
            return
        transport.write(close_chunks(code, reason) if conn.sse else close_frame(code, reason))
        transport.close()
        asyncio.get_running_loop().call_later(CLOSE_GRACE, transport.abort)

    def reset(self, epoch: str, base: StreamId, *, rollback: bool = False) -> None:
        """A new history (the bucket was recreated or rolled back): forget the window, start it
        at `base` and close every connection with 4009."""
        self.epoch = epoch
        self.window.reset(base)
        cause, reason = ("rollback", ROLLED_BACK) if rollback else ("epochChange", RECREATED)
        for conn in list(self.connections):
            self.closed[cause] += 1
            self.close_now(conn, CloseCode.BUCKET_RESET, reason)
        self._wake()

    def restart(
        self, epoch: str, heads: Sequence[StreamId], *, rollback: bool = False
    ) -> None:
        """A new history from each shard's head `heads`: every connection closed with 4009."""
        self.heads = tuple(heads)
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
            self.closed["trimGap"] += 1
            self.close_now(conn, CloseCode.BUCKET_RESET, TRIMMED)
        self.window.reset(trimmed)
        self._wake()
        return len(behind)

    # --- catching up (publisher.delivery.replay runs the loops) ---------------------------

    def _go_live(self, conn: Subscriber) -> None:
        conn.live = True
        conn.replaying = False
        conn.coalesced = None
        self._lagging.discard(conn)
        self._coalescible.discard(conn)
        conn.task = None

    def _wrote_one(self, conn: Subscriber, position: StreamId | None, size: int) -> None:
        """Count one item written to `conn` outside the fan-out (catching up, replaying):
        the item at window position `position` (None: replayed from a shard of a bucket in a
        Redis Cluster, at no window position)."""
        self.delivered += 1
        self.bytes_written += size
        if conn.sse:
            self.sse_delivered += 1
        if position is None:
            return
        conn.last_sent = position
        if self.trace is not None:
            self.trace.wrote_late(position, conn.registration.service, time.time())

    async def _writable(self, conn: Subscriber) -> bool:
        """Wait until `conn` can take another frame without passing `send_buffer`; False when
        it is closing instead."""
        if conn.transport.get_write_buffer_size() > self.send_buffer:
            # The transport pauses its protocol above `send_buffer` (set at registration);
            # this is aiohttp's own wait for it to drain below the low-water mark.
            await conn.protocol._drain_helper()
        return not (conn.closing or conn.transport.is_closing())

    # --- reporting (publisher.delivery.hub_stats) ------------------------------------------

    def coalescing(self) -> dict[str, int]:
        """The coalesced catch-ups since start and now (`hub_stats.coalescing`)."""
        return hub_stats.coalescing(self)

    def stats(self, publisher_id: str) -> list[dict[str, Any]]:
        """One entry per registered (connection, resource) (`hub_stats.registrations`)."""
        return hub_stats.registrations(self, publisher_id)


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
