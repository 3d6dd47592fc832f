"""The per-connection delivery decision (publisher.delivery.decision), every branch, and the
fan-out carrying it out alike for one entry and for a batch (pure: no Redis, no event loop)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from changefeed.cursor import ZERO, StreamId
from changefeed.protocol import ChangeKind, Registration
from publisher.bucket import LogEntry
from publisher.delivery.coalesce import Coalesced
from publisher.delivery.counters import Counters
from publisher.delivery.decision import (
    BEHIND,
    CHUNK,
    CLOSING,
    FOLD,
    FOLDING,
    FRAME,
    PASS,
    PASSING,
    SKIP,
    STREAM,
    WEBSOCKET,
    Mode,
    Verdict,
    decide,
    mode_of,
)
from publisher.delivery.fanout import FanOut
from publisher.delivery.lagging import Lagging
from publisher.delivery.order import TotalOrder
from publisher.delivery.subscribers import Routes, Subscriber
from publisher.delivery.waiters import Waiters
from publisher.delivery.window import Window

BUFFER = 100
ROOMY = 1000
"""The fan-out's send buffer below: three frames fit in it."""


@dataclass
class Recorded:
    """A transport that keeps what it is written in its buffer (`queued` bytes), as one whose
    listener reads nothing meanwhile: what a batch assumes of its frames too."""

    queued: int = 0
    closing: bool = False
    writes: list[bytes] = field(default_factory=list)

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        self.queued += len(data)

    def get_write_buffer_size(self) -> int:
        return self.queued

    def is_closing(self) -> bool:
        return self.closing

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True


def _conn(*, sse: bool = False, coalesce: bool = False, queued: int = 0) -> Subscriber:
    registration = Registration("i", "s", (ChangeKind("vm", ("nic",)),), 1, coalesce=coalesce)
    return Subscriber(registration, Recorded(queued), None, "test", sse=sse)


# --- the decision ----------------------------------------------------------------------------


def _decide(conn: Subscriber, closing: bool, queued: int) -> Verdict:
    """The fan-out's question for `conn`: its mode and its transport's facts."""
    return decide(conn.mode, closing, queued, BUFFER)


def test_a_live_websocket_with_room_is_written_the_frame() -> None:
    assert _conn().mode is WEBSOCKET
    assert _decide(_conn(), False, 0) is FRAME
    assert _decide(_conn(), False, BUFFER) is FRAME, "at send_buffer: still room"


def test_a_live_sse_stream_with_room_is_written_the_chunk() -> None:
    assert _conn(sse=True).mode is STREAM
    assert _decide(_conn(sse=True), False, 0) is CHUNK


def test_a_live_connection_past_send_buffer_falls_behind() -> None:
    assert _decide(_conn(), False, BUFFER + 1) is BEHIND
    assert _decide(_conn(sse=True), False, BUFFER + 1) is BEHIND


def test_a_closing_transport_or_connection_is_skipped_before_its_buffer_counts() -> None:
    assert _decide(_conn(), True, BUFFER + 1) is SKIP
    assert _decide(_conn(sse=True), True, 0) is SKIP
    conn = _conn()
    assert conn.close()
    assert conn.mode is CLOSING
    assert _decide(conn, False, BUFFER + 1) is SKIP


def test_a_connection_catching_up_from_the_window_is_passed() -> None:
    conn = _conn()
    conn.fall_behind(ZERO)
    assert conn.mode is PASSING
    for closing, queued in ((False, 0), (True, 0), (False, BUFFER + 1)):
        assert _decide(conn, closing, queued) is PASS
    resumed = _conn(sse=True)
    resumed.resume_at(ZERO)
    assert resumed.mode is PASSING


def test_a_connection_in_a_coalesced_catch_up_folds_unless_it_is_closing() -> None:
    conn = _conn(coalesce=True)
    conn.fall_behind(ZERO)
    conn.coalesce(10)
    assert conn.mode is FOLDING
    assert _decide(conn, False, BUFFER + 1) is FOLD
    assert _decide(conn, True, 0) is FOLD
    assert conn.close()
    assert conn.mode is PASSING
    assert _decide(conn, False, 0) is PASS


def test_a_connection_that_goes_live_again_is_written_again() -> None:
    conn = _conn(sse=True, coalesce=True)
    conn.fall_behind(ZERO)
    conn.coalesce(10)
    conn.go_live()
    assert conn.mode is STREAM
    assert _decide(conn, False, 0) is CHUNK


def test_a_catch_up_is_answered_as_if_its_connection_were_live() -> None:
    """A catch-up asks before each write: `BEHIND` means wait for the socket to drain."""
    conn = _conn()
    conn.fall_behind(ZERO)
    assert conn.written_as() is WEBSOCKET
    assert decide(conn.written_as(), False, 0, BUFFER) is FRAME
    assert decide(conn.written_as(), False, BUFFER + 1, BUFFER) is BEHIND
    assert decide(conn.written_as(), True, 0, BUFFER) is SKIP
    coalescing = _conn(sse=True, coalesce=True)
    coalescing.fall_behind(ZERO)
    coalescing.coalesce(10)
    assert decide(coalescing.written_as(), False, 0, BUFFER) is CHUNK
    assert coalescing.close()
    assert coalescing.written_as() is CLOSING


@pytest.mark.parametrize(
    ("live", "sse", "coalescing", "closing", "mode"),
    [
        (True, False, False, False, WEBSOCKET),
        (True, True, False, False, STREAM),
        (True, False, False, True, CLOSING),
        (True, True, True, True, CLOSING),
        (False, False, False, False, PASSING),
        (False, True, True, False, FOLDING),
        (False, False, True, True, PASSING),
    ],
)
def test_the_mode_of_every_state(
    live: bool, sse: bool, coalescing: bool, closing: bool, mode: Mode
) -> None:
    assert mode_of(live, sse, coalescing, closing) is mode


def test_every_verdict_is_reached() -> None:
    assert set(Verdict) == {FOLD, PASS, SKIP, BEHIND, CHUNK, FRAME}


@pytest.mark.parametrize("mode", [WEBSOCKET, STREAM, FOLDING, PASSING, CLOSING])
def test_decide_is_the_lookup_the_fan_out_makes(mode: Mode) -> None:
    """The fan-out's loop indexes a connection's mode without calling `decide`: the same."""
    for closing in (False, True):
        for queued in (0, BUFFER, BUFFER + 1):
            assert decide(mode, closing, queued, BUFFER) is mode[closing][queued > BUFFER]


# --- the fan-out carries it out, one entry or a batch ------------------------------------------


class Bench:
    """A fan-out over a window of 4, without the hub: whom it sends to catch up or closes."""

    def __init__(self) -> None:
        self.window = Window(4, ZERO)
        self.routes = Routes()
        self.counters = Counters()
        self.lagging = Lagging(2, self.counters)
        self.caught: list[Subscriber] = []
        self.closed: list[Subscriber] = []
        self.fanout = FanOut(self.window, self.routes, self.lagging, self.counters, Waiters(),
                             TotalOrder(), ROOMY, catch_up=self.caught.append,
                             close_slow=self.closed.append)

    def add(self, conn: Subscriber) -> Subscriber:
        self.routes.add(conn)
        return conn


def _entries(first: int, count: int) -> list[LogEntry]:
    return [LogEntry(StreamId(ms, 0), "vm", ("nic",), f"vm-{ms}")
            for ms in range(first, first + count)]


def _run(batched: bool, entries: list[LogEntry]) -> tuple[Bench, list[Subscriber]]:
    bench = Bench()
    conns = [
        bench.add(_conn()),
        bench.add(_conn(sse=True)),
        bench.add(_conn(queued=ROOMY + 1)),  # behind at once
        bench.add(_conn(queued=ROOMY - 30)),  # behind after its first item (a frame: 126 bytes)
        bench.add(_conn()),
    ]
    conns[-1].transport.closing = True  # type: ignore[attr-defined]
    if batched:
        bench.fanout.publish(entries, "e")
    else:
        for entry in entries:
            bench.fanout.publish([entry], "e")
    return bench, conns


@pytest.mark.parametrize("batched", [False, True], ids=["one at a time", "one batch"])
def test_one_entry_and_a_batch_carry_out_the_same_verdicts(batched: bool) -> None:
    bench, (ws, sse, full, filling, closing) = _run(batched, _entries(1, 3))
    assert [e.position.ms for e in bench.window.after(ZERO)] == [1, 2, 3]
    frames = [e.frame for e in bench.window.after(ZERO)]
    assert b"".join(ws.transport.writes) == b"".join(frames)  # type: ignore[attr-defined]
    assert ws.live and ws.last_sent == StreamId(3, 0)
    chunks = b"".join(sse.transport.writes)  # type: ignore[attr-defined]
    assert chunks.count(b"id: e.") == 3 and sse.live
    assert not full.live and full.position == ZERO and full.transport.writes == []  # type: ignore[attr-defined]
    assert not filling.live and filling.position == StreamId(1, 0)
    assert b"".join(filling.transport.writes) == frames[0]  # type: ignore[attr-defined]
    assert closing.transport.writes == [] and closing.live  # type: ignore[attr-defined]
    assert bench.caught == [full, filling] or bench.caught == [filling, full]
    assert bench.closed == []
    assert bench.counters.delivered == 3 + 3 + 1 and bench.counters.sse_delivered == 3


def test_both_paths_leave_the_same_state() -> None:
    one, one_conns = _run(False, _entries(1, 3))
    batch, batch_conns = _run(True, _entries(1, 3))
    for a, b in zip(one_conns, batch_conns, strict=True):
        assert (a.live, a.position, a.last_sent) == (b.live, b.position, b.last_sent)
        assert b"".join(a.transport.writes) == b"".join(b.transport.writes)  # type: ignore[attr-defined]
    assert (one.counters.delivered, one.counters.bytes_written) == (
        batch.counters.delivered, batch.counters.bytes_written)


@pytest.mark.parametrize("batched", [False, True], ids=["one at a time", "one batch"])
def test_a_coalescing_connection_folds_and_is_closed_when_its_set_overflows(
    batched: bool,
) -> None:
    bench = Bench()
    conn = bench.add(_conn(coalesce=True, queued=ROOMY + 1))
    entries = _entries(1, 8)
    for entry in entries[:1]:
        bench.fanout.publish([entry], "e")
    assert not conn.live and bench.caught == [conn]
    # The window (4) fills; before it drops entry 1 the connection switches to a coalesced set
    # of at most 2 ids, which the third id overflows.
    rest = entries[1:]
    if batched:
        bench.fanout.publish(rest, "e")
    else:
        for entry in rest:
            bench.fanout.publish([entry], "e")
    assert isinstance(conn.coalesced, Coalesced)
    assert bench.counters.coalesced["started"] == 1
    assert conn in bench.closed


def test_a_lagging_connection_the_window_moved_past_is_closed_as_slow() -> None:
    bench = Bench()
    conn = bench.add(_conn(queued=ROOMY + 1))
    bench.fanout.publish(_entries(1, 1), "e")
    assert bench.caught == [conn] and bench.closed == []
    bench.fanout.publish(_entries(2, 4), "e")
    assert bench.closed == [conn], "the window (4) holds 2..5: entry 1 is gone"
