"""The fan-out: route each new log entry to the connections it matches and carry out, for each,
the delivery decision (publisher.delivery.decision).

An entry's websocket frame is built once and the same bytes are written to every matching
connection's transport, without awaiting. One entry (a tail read of one commit, the common case)
is written at once to each connection (`_one`); a batch (the tail fell behind) is routed
(`_route`), then each connection is written once, the frames of every entry it matches joined
(`_write`), so it costs one system call for all of them. Both take the decision per connection
and entry as `decide` does, by the lookup in the connection's mode that `decide` is
(`conn.mode[closing][queued > send_buffer]`, without a call per delivery); in a batch a
connection's `queued` counts the frames of the batch queued for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from changefeed.cursor import ZERO, StreamId
from changefeed.protocol import text_frame
from changefeed.sse import change_chunk
from publisher.bucket import LogEntry
from publisher.delivery.counters import Counters
from publisher.delivery.decision import BEHIND, CHUNK, FOLD, FRAME
from publisher.delivery.lagging import Lagging
from publisher.delivery.order import Order, StampedEntry
from publisher.delivery.subscribers import Routes, Subscriber
from publisher.delivery.trace import TraceLog
from publisher.delivery.waiters import Waiters
from publisher.delivery.window import Window, WindowEntry

Close = Callable[[Subscriber], None]


@dataclass(slots=True)
class Pending:
    """What one batch will write to a connection, and its transport's queue with it."""

    size: int
    closing: bool
    frames: list[bytes] = field(default_factory=list)
    last: StreamId = ZERO
    """The window position of the last of `frames`: the connection is told it was sent it
    (`Subscriber.sent`) once, when they are written."""


@dataclass(slots=True)
class Routed:
    """A batch routed: what each connection is to be written, and what it changed."""

    pending: dict[Subscriber, Pending]
    fresh: list[WindowEntry]
    """The new entries, appended to the window in log order."""
    written: list[WindowEntry]
    """The new entries taken by at least one live connection."""
    sse_sent: int
    overflowed: dict[Subscriber, None]
    """Coalescing connections whose catch-up passed its limit: closed after the writes."""


def encode(entry: LogEntry, epoch: str) -> WindowEntry:
    """`entry` of `epoch` encoded once for every connection."""
    payload = entry.item(epoch).encode()
    if isinstance(entry, StampedEntry):
        return WindowEntry(
            entry.position, entry.resource, entry.sub_resources, entry.changed_resource_id,
            payload, text_frame(payload), cursor=entry.cursor, published=entry.published,
        )
    return WindowEntry(entry.position, entry.resource, entry.sub_resources,
                       entry.changed_resource_id, payload, text_frame(payload))


def sse_of(entry: WindowEntry, order: Order, epoch: str) -> bytes:
    """`entry` as a server-sent event's chunk, built once for every SSE subscriber."""
    chunk = entry.sse
    if chunk is None:
        chunk = entry.sse_chunk(change_chunk(
            order.cursor(epoch, entry.position, entry.cursor), entry.payload))
    return chunk


class FanOut:
    """Writes each new entry to the live connections it matches; `catch_up` starts the catch-up
    of one that fell behind, `close_slow` closes one whose coalesced catch-up overflowed or that
    the window moved past."""

    def __init__(
        self, window: Window, routes: Routes, lagging: Lagging, counters: Counters,
        waiters: Waiters, order: Order, send_buffer: int, *, catch_up: Close, close_slow: Close,
    ) -> None:
        self.window = window
        self.routes = routes
        self.send_buffer = send_buffer
        """Bytes a live connection's transport may hold before it falls behind."""
        self.trace: TraceLog | None = None
        """The delivery trace (publisher.delivery.trace), None when `trace.items` is 0."""
        self.observe_latency: Callable[[float], None] | None = None
        """Called once per new item written to at least one live listener, with the seconds
        from its commit (its Redis time) to the write: the metrics' histogram."""
        self._lagging = lagging
        self._counters = counters
        self._waiters = waiters
        self._order = order
        self._catch_up = catch_up
        self._close_slow = close_slow

    def limit(self, send_buffer: int) -> None:
        """A reloaded `limits.sendBuffer`."""
        self.send_buffer = send_buffer

    def trace_with(self, trace: TraceLog | None) -> None:
        """Record the delivery trace in `trace` (None: stop)."""
        self.trace = trace

    def observe(self, latency: Callable[[float], None] | None) -> None:
        """Report each new item's commit -> write seconds to `latency`."""
        self.observe_latency = latency

    def publish(self, entries: Sequence[LogEntry], epoch: str) -> None:
        """Append new log entries of `epoch` to the window and write them to the live matching
        connections; then close whom the window moved past and wake the waiters."""
        if len(entries) == 1:
            overflowed: Sequence[Subscriber] = self._one(entries[0], epoch)
        else:
            overflowed = self._batch(entries, epoch)
        for conn in overflowed:
            self._close_slow(conn)
        for conn in self._lagging.fallen(self.window):
            self._close_slow(conn)
        self._waiters.wake()

    def _behind(self, conn: Subscriber, position: StreamId) -> None:
        self._lagging.fall_behind(conn, position)
        self._catch_up(conn)

    def _append(self, raw: LogEntry, epoch: str) -> WindowEntry:
        entry = encode(raw, epoch)
        for conn in self._lagging.before_append(self.window):
            self._close_slow(conn)
        self.window.append(entry)
        return entry

    def _one(self, raw: LogEntry, epoch: str) -> list[Subscriber]:
        """One entry: each connection it matches is carried out its verdict at once, with no
        per-connection bookkeeping beyond the list of whom it was written to (told so together
        afterwards, and the counters counted once). The coalescing connections that overflowed
        are returned."""
        previous = self.window.head
        overflowed: list[Subscriber] = []
        if raw.position <= previous:
            return overflowed
        entry = self._append(raw, epoch)
        trace = self.trace
        read_at = time.time() if trace is not None else 0.0
        written: list[Subscriber] = []
        took = written.append
        send_buffer = self.send_buffer
        position = entry.position
        frame = entry.frame
        chunk = b""
        chunks = 0
        for conn in self.routes.matching(
            entry.resource, entry.sub_resources, entry.changed_resource_id
        ):
            transport = conn.transport
            # decide(conn.mode, closing, queued, send_buffer), its lookup without the call
            verdict = conn.mode[transport.is_closing()][
                transport.get_write_buffer_size() > send_buffer]
            if verdict is FRAME:
                transport.write(frame)
            elif verdict is CHUNK:
                chunk = sse_of(entry, self._order, epoch)
                transport.write(chunk)
                chunks += 1
            else:
                if verdict is FOLD and not self._lagging.fold(conn, entry):
                    overflowed.append(conn)
                elif verdict is BEHIND:
                    self._behind(conn, previous)
                continue
            took(conn)
        Subscriber.all_sent(written, position)
        if trace is not None:
            trace.published_one(epoch, position, written, read_at, time.time())
        if written:
            frames = len(written) - chunks
            self._counters.wrote(len(written), frames * len(frame) + chunks * len(chunk), chunks)
            if self.observe_latency is not None:
                committed = entry.published or position.ms
                self.observe_latency(max(time.time() * 1000 - committed, 0.0) / 1000)
        return overflowed

    def _batch(self, entries: Sequence[LogEntry], epoch: str) -> list[Subscriber]:
        """Several entries: routed, written (one write per connection), then counted."""
        trace = self.trace
        read_at = time.time() if trace is not None else 0.0
        routed = self._route(entries, epoch)
        delivered, sent = _write(routed.pending)
        self._account(routed, epoch, delivered, sent, read_at)
        return list(routed.overflowed)

    def _route(self, entries: Sequence[LogEntry], epoch: str) -> Routed:
        """Append each new entry to the window and queue its frame for every connection whose
        verdict is to write it (its queue counting what the batch queued for it already)."""
        window = self.window
        send_buffer = self.send_buffer
        pending: dict[Subscriber, Pending] = {}
        pending_of = pending.get
        written: list[WindowEntry] = []
        fresh: list[WindowEntry] = []
        sse_sent = 0
        overflowed: dict[Subscriber, None] = {}
        for raw in entries:
            previous = window.head
            if raw.position <= previous:
                continue  # already seen (a re-read after a Redis reconnect)
            entry = self._append(raw, epoch)
            fresh.append(entry)
            position = entry.position
            frame = entry.frame
            frame_size = len(frame)
            taken = False
            for conn in self.routes.matching(
                entry.resource, entry.sub_resources, entry.changed_resource_id
            ):
                queued = pending_of(conn)
                if queued is None:
                    transport = conn.transport
                    queued = pending[conn] = Pending(transport.get_write_buffer_size(),
                                                     transport.is_closing(), [])
                verdict = conn.mode[queued.closing][queued.size > send_buffer]  # decide()
                if verdict is FRAME:
                    queued.frames.append(frame)
                    queued.size += frame_size
                elif verdict is CHUNK:
                    chunk = sse_of(entry, self._order, epoch)
                    queued.frames.append(chunk)
                    queued.size += len(chunk)
                    sse_sent += 1
                else:
                    if verdict is FOLD and not self._lagging.fold(conn, entry):
                        overflowed[conn] = None
                    elif verdict is BEHIND:
                        self._behind(conn, previous)
                    continue
                queued.last = position
                taken = True
            if taken:
                written.append(entry)
        return Routed(pending, fresh, written, sse_sent, overflowed)

    def _account(
        self, routed: Routed, epoch: str, delivered: int, sent: int, read_at: float
    ) -> None:
        """Count a written batch: the counters, the delivery trace and the latency metric."""
        self._counters.wrote(delivered, sent, routed.sse_sent)
        if self.trace is not None:
            self.trace.published(epoch, routed.fresh, routed.pending, delivered, read_at,
                                 time.time())
        observe_latency = self.observe_latency
        if routed.written and observe_latency is not None:
            now_ms = time.time() * 1000
            for entry in routed.written:
                committed = entry.published or entry.position.ms
                observe_latency(max(now_ms - committed, 0.0) / 1000)


def _write(pending: dict[Subscriber, Pending]) -> tuple[int, int]:
    """One write per connection of its queued frames; (frames, bytes) written."""
    delivered = sent = 0
    for conn, queued in pending.items():
        frames = queued.frames
        if frames:
            data = frames[0] if len(frames) == 1 else b"".join(frames)
            conn.transport.write(data)
            conn.sent(queued.last)
            delivered += len(frames)
            sent += len(data)
    return delivered, sent


__all__ = ["FanOut", "Pending", "Routed", "encode", "sse_of"]
