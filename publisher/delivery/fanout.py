"""The fan-out of a batch: `Hub.fan_out` of several new entries at once (the tail fell behind).

Each connection gets one write per batch: the frames of every entry it matches, joined, so a
connection costs one system call for all of them instead of one per entry. A connection takes
frames while what it has queued, counting those of this batch, is within the hub's
`send_buffer`; past it, it falls behind after the last frame it took. The batch is routed
(`_route`), written (`_write`), then counted (`_account`): one call of each per batch, none per
entry or connection. A single entry (the common case) takes `Hub._publish_one` instead.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from changefeed.cursor import StreamId
from publisher.bucket import LogEntry
from publisher.delivery.coalesce import Coalesced, CoalesceOverflow
from publisher.delivery.subscribers import Routes, Subscriber
from publisher.delivery.trace import TraceLog
from publisher.delivery.window import Window, WindowEntry

log = structlog.get_logger(__name__)


class Hub(Protocol):
    """What the fan-out uses of the hub (`publisher.delivery.hub.Hub`)."""

    window: Window
    routes: Routes
    send_buffer: int
    epoch: str
    coalesce_ids: int
    coalesced: Counter[str]
    _coalescible: set[Subscriber]
    _lagging: set[Subscriber]
    trace: TraceLog | None
    observe_latency: Callable[[float], None] | None
    delivered: int
    bytes_written: int
    sse_delivered: int

    def encode(self, entry: LogEntry) -> WindowEntry: ...
    def sse_of(self, entry: WindowEntry) -> bytes: ...
    def close_slow(self, conn: Subscriber) -> None: ...
    def _folded(self, conn: Subscriber, entry: WindowEntry) -> bool: ...
    def _fall_behind(self, conn: Subscriber, position: StreamId) -> None: ...
    def _published(self, overflowed: Iterable[Subscriber]) -> None: ...


@dataclass(slots=True)
class Pending:
    """What one batch will write to a connection, and its queue size with it."""

    size: int
    frames: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class Routed:
    """A batch routed: what each connection is to be written, and what it changed."""

    pending: dict[Subscriber, Pending]
    fresh: list[WindowEntry]
    """The new entries, appended to the window in log order."""
    written: list[WindowEntry]
    """The new entries taken by at least one live connection."""
    sse_sent: int
    overflowed: set[Subscriber]
    """Coalescing connections whose catch-up passed its limit: closed after the writes."""


def publish_batch(hub: Hub, entries: Sequence[LogEntry]) -> None:
    """Append `entries` to the hub's window and write them to live matching connections."""
    trace = hub.trace
    read_at = time.time() if trace is not None else 0.0
    routed = _route(hub, entries)
    delivered, sent = _write(routed.pending)
    _account(hub, routed, delivered, sent, read_at)
    hub._published(routed.overflowed)


def _route(hub: Hub, entries: Sequence[LogEntry]) -> Routed:
    """Append each new entry to the window and queue its frame for every live connection it
    matches that has room; fold it into the coalesced catch-ups of the lagging ones."""
    window = hub.window
    send_buffer = hub.send_buffer
    pending: dict[Subscriber, Pending] = {}
    written: list[WindowEntry] = []
    fresh: list[WindowEntry] = []
    sse_sent = 0
    overflowed: set[Subscriber] = set()
    for raw in entries:
        if raw.position <= window.head:
            continue  # already seen (a re-read after a Redis reconnect)
        entry = hub.encode(raw)
        previous = window.head
        if hub._coalescible and len(window) >= window.capacity:
            coalesce_before(hub, window.oldest())
        window.append(entry)
        fresh.append(entry)
        matching = hub.routes.matching(
            entry.resource, entry.sub_resources, entry.changed_resource_id
        )
        taken = False
        for conn in matching:
            if not conn.live:
                if conn.coalesced is not None and not hub._folded(conn, entry):
                    overflowed.add(conn)
                continue
            queued = pending.get(conn)
            if queued is None:
                transport = conn.transport
                if transport.is_closing():
                    continue
                queued = pending[conn] = Pending(transport.get_write_buffer_size())
            if queued.size > send_buffer:
                hub._fall_behind(conn, previous)
                continue
            if conn.sse:
                frame = hub.sse_of(entry)
                sse_sent += 1
            else:
                frame = entry.frame
            queued.frames.append(frame)
            queued.size += len(frame)
            conn.last_sent = entry.position
            taken = True
        if taken:
            written.append(entry)
    return Routed(pending, fresh, written, sse_sent, overflowed)


def _write(pending: dict[Subscriber, Pending]) -> tuple[int, int]:
    """One write per connection of its queued frames; (frames, bytes) written."""
    delivered = sent = 0
    for conn, queued in pending.items():
        frames = queued.frames
        if frames:
            data = frames[0] if len(frames) == 1 else b"".join(frames)
            conn.transport.write(data)
            delivered += len(frames)
            sent += len(data)
    return delivered, sent


def _account(hub: Hub, routed: Routed, delivered: int, sent: int, read_at: float) -> None:
    """Count a written batch: the hub's counters, the delivery trace and the latency metric."""
    hub.delivered += delivered
    hub.bytes_written += sent
    hub.sse_delivered += routed.sse_sent
    if hub.trace is not None:
        hub.trace.published(hub.epoch, routed.fresh, routed.pending, delivered, read_at,
                            time.time())
    observe_latency = hub.observe_latency
    if routed.written and observe_latency is not None:
        now_ms = time.time() * 1000
        for entry in routed.written:
            committed = entry.published or entry.position.ms
            observe_latency(max(now_ms - committed, 0.0) / 1000)


def coalesce_before(hub: Hub, oldest: WindowEntry | None) -> None:
    """The window is about to drop `oldest`: switch every coalescible connection not sent
    it yet to a coalesced catch-up, holding what the window has for it."""
    if oldest is None:
        return
    for conn in [c for c in hub._coalescible if c.position < oldest.position]:
        hub._coalescible.discard(conn)
        hub._lagging.discard(conn)
        coalesced = conn.coalesced = Coalesced(hub.coalesce_ids)
        hub.coalesced["started"] += 1
        try:
            for entry in hub.window.after(conn.position):
                if conn.wants(entry):
                    coalesced.fold(entry.resource, entry.sub_resources,
                                   entry.changed_resource_id, entry.position, entry.cursor,
                                   entry.published)
        except CoalesceOverflow:
            hub.close_slow(conn)
            continue
        log.info(
            "slow consumer: coalesced catch-up",
            instance=conn.registration.instance,
            service=conn.registration.service,
            remote=conn.remote,
            ids=len(coalesced),
        )
