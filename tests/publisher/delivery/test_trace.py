"""The delivery trace's pure core (publisher.delivery.trace): recording, attribution of the frames
of a batch to their entries, the bounds by count and age, and every reason a cursor is not
traced."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from changefeed.cursor import Position, StreamId
from publisher.delivery.trace import (
    MAX_SERVICE_CHARS,
    MAX_SERVICES,
    OTHER,
    NotTraced,
    Record,
    TraceLog,
    iso,
    record_body,
)

EPOCH = "abcdefghij"


@dataclass
class Entry:
    position: StreamId
    frame: bytes
    sse: bytes | None = None


@dataclass(frozen=True)
class Reg:
    service: str


@dataclass(eq=False)
class Conn:
    registration: Reg


@dataclass
class Queued:
    frames: list[bytes]


def written(*writes: tuple[str, list[bytes]]) -> dict[Conn, Queued]:
    """The hub's writes of a batch: one connection per (service, frames written to it)."""
    return {Conn(Reg(service)): Queued(list(frames)) for service, frames in writes}


def publish(trace: TraceLog, epoch: str, entries: list[Entry], writes: dict[Conn, Queued],
            read_at: float, written_at: float) -> None:
    """`trace.published` as the hub calls it, with the count of frames written."""
    delivered = sum(len(q.frames) for q in writes.values())
    trace.published(epoch, entries, writes, delivered, read_at, written_at)


def entry(ms: int, seq: int = 0) -> Entry:
    # Distinct objects per entry, as the hub builds them (`bytes(...)` of a fresh bytearray).
    return Entry(StreamId(ms, seq), bytes(bytearray(b"frame %d-%d" % (ms, seq))))


def at(ms: int, seq: int = 0) -> Position:
    return Position.single(EPOCH, StreamId(ms, seq))


def found(trace: TraceLog, cursor: Position, head: StreamId, now: float = 0.0) -> Record:
    record = trace.find(cursor, EPOCH, head, now)
    assert isinstance(record, Record), record
    return record


def test_one_entry_counts_the_listeners_of_each_service() -> None:
    trace = TraceLog(10, None)
    one = entry(1000)
    frames = [one.frame]
    publish(trace, EPOCH, [one], written(("tcns", frames), ("tcns", frames), ("napi", frames)),
                    1.5, 1.6)
    record = found(trace, at(1000), one.position)
    assert record.read_at == 1.5
    assert {s: (w.listeners, w.first, w.last) for s, w in record.services.items()} == {
        "tcns": (2, 1.6, 1.6), "napi": (1, 1.6, 1.6)}


def test_a_batch_attributes_each_frame_to_its_entry_by_identity() -> None:
    trace = TraceLog(10, None)
    a, b, c = entry(1000), entry(1000, 1), entry(1001)
    c.sse = bytes(bytearray(b"sse chunk of c"))
    writes = written(
        ("tcns", [a.frame, b.frame, c.frame]),
        ("tcns", [a.frame]),               # fell behind after a
        ("napi", [b.frame]),               # matched b only
        ("sse", [c.sse]),                  # a server-sent events subscriber
        ("idle", []),                      # fell behind before its first frame
    )
    publish(trace, EPOCH, [a, b, c], writes, 2.0, 2.1)
    counts = {
        e.position: {s: w.listeners for s, w in found(trace, Position.single(EPOCH, e.position),
                                                      c.position).services.items()}
        for e in (a, b, c)
    }
    assert counts == {a.position: {"tcns": 2}, b.position: {"tcns": 1, "napi": 1},
                      c.position: {"tcns": 1, "sse": 1}}


def test_a_batch_written_whole_to_every_connection_counts_each_entry() -> None:
    trace = TraceLog(10, None)
    a, b = entry(1000), entry(1000, 1)
    both = [a.frame, b.frame]
    publish(trace, EPOCH, [a, b], written(("tcns", both), ("tcns", both), ("napi", both)),
            2.0, 2.1)
    for e in (a, b):
        record = found(trace, Position.single(EPOCH, e.position), b.position)
        assert {s: w.listeners for s, w in record.services.items()} == {"tcns": 2, "napi": 1}


def test_late_writes_move_the_last_write_and_add_listeners() -> None:
    trace = TraceLog(10, None)
    one = entry(1000)
    publish(trace, EPOCH, [one], written(("tcns", [one.frame])), 1.0, 1.1)
    trace.wrote_late(one.position, "tcns", 3.0)
    trace.wrote_late(one.position, "napi", 2.0)
    trace.wrote_late(StreamId(5, 0), "tcns", 3.0)  # not traced: ignored
    record = found(trace, at(1000), one.position)
    tcns, napi = record.services["tcns"], record.services["napi"]
    assert (tcns.listeners, tcns.first, tcns.last) == (2, 1.1, 3.0)
    assert (napi.listeners, napi.first, napi.last) == (1, 2.0, 2.0)


def test_the_count_bound_drops_the_oldest() -> None:
    trace = TraceLog(3, None)
    entries = [entry(1000 + i) for i in range(5)]
    for e in entries:
        publish(trace, EPOCH, [e], {}, 1.0, 1.0)
    head = entries[-1].position
    assert len(trace) == 3
    gone = trace.find(at(1001), EPOCH, head, 1.0)
    assert gone == NotTraced(
        "NotTraced", "not traced: older than the trace window of 3 changes / no age limit")
    assert found(trace, at(1002), head).position == StreamId(1002, 0)
    assert trace.describe(EPOCH) == {"items": 3, "maxAge": None, "held": 3,
                                     "oldest": at(1002).encode()}


def test_the_age_bound_drops_what_was_read_too_long_ago() -> None:
    trace = TraceLog(100, 10.0)
    old, new = entry(1000), entry(2000)
    publish(trace, EPOCH, [old], {}, 100.0, 100.0)
    publish(trace, EPOCH, [new], {}, 105.0, 105.0)
    assert found(trace, at(1000), new.position, 109.0)
    gone = trace.find(at(1000), EPOCH, new.position, 111.0)
    assert isinstance(gone, NotTraced) and gone.message == (
        "not traced: older than the trace window of 100 changes / 10 s")
    assert found(trace, at(2000), new.position, 111.0)
    assert isinstance(trace.find(at(2000), EPOCH, new.position, 116.0), NotTraced)
    assert len(trace) == 0


def test_every_reason_for_no_record() -> None:
    trace = TraceLog(10, None)
    a, c = entry(1000), entry(1002)
    publish(trace, EPOCH, [a, c], {}, 1.0, 1.0)
    head = c.position
    ahead = trace.find(at(1003), EPOCH, head, 1.0)
    assert isinstance(ahead, NotTraced) and ahead.code == "NotReadYet"
    assert at(1002).encode() in ahead.message
    between = trace.find(at(1001), EPOCH, head, 1.0)
    assert isinstance(between, NotTraced) and between.code == "NoSuchChange"
    before = trace.find(at(999), EPOCH, head, 1.0)
    assert isinstance(before, NotTraced) and "before this publisher began tracing" in before.message
    other = trace.find(Position.single("zzzzzzzzzz", a.position), EPOCH, head, 1.0)
    assert isinstance(other, NotTraced) and other.code == "OtherEpoch"


def test_a_new_epoch_forgets_everything() -> None:
    trace = TraceLog(10, None)
    publish(trace, EPOCH, [entry(1000)], {}, 1.0, 1.0)
    publish(trace, "newepochxx", [entry(5)], {}, 2.0, 2.0)
    assert len(trace) == 1
    assert isinstance(trace.find(at(1000), EPOCH, StreamId(1000, 0), 2.0), NotTraced)


def test_services_are_bounded_per_change() -> None:
    trace = TraceLog(10, None)
    one = entry(1000)
    writes = [(f"service-{i}", [one.frame]) for i in range(MAX_SERVICES + 5)]
    writes.append(("x" * 5000, [one.frame]))
    publish(trace, EPOCH, [one], written(*writes), 1.0, 1.0)
    record = found(trace, at(1000), one.position)
    assert len(record.services) == MAX_SERVICES + 1
    assert record.services[OTHER].listeners == 6
    assert all(len(name) <= MAX_SERVICE_CHARS for name in record.services)


def test_resize_applies_the_new_bounds_at_once() -> None:
    trace = TraceLog(10, None)
    for i in range(5):
        publish(trace, EPOCH, [entry(1000 + i)], {}, float(i), float(i))
    trace.resize(2, None, 5.0)
    assert len(trace) == 2
    trace.resize(2, 1.5, 5.0)
    assert len(trace) == 1
    with pytest.raises(ValueError):
        trace.resize(0, None, 5.0)


def test_the_answer_shows_times_after_the_commit() -> None:
    record = Record(StreamId(1_700_000_000_000, 0), 1_700_000_000.002)
    record.wrote("tcns", 2, 1_700_000_000.0035)
    body = record_body(record, Position.single(EPOCH, record.position), "p1")
    assert body["committedAt"] == "2023-11-14T22:13:20.000Z"
    assert body["readAt"] == "2023-11-14T22:13:20.002Z"
    assert body["listeners"] == 2
    assert body["services"]["tcns"]["listeners"] == 2
    assert body["services"]["tcns"]["firstWriteMs"] == pytest.approx(3.5, abs=0.01)
    assert iso(0.9996) == "1970-01-01T00:00:01.000Z"


def test_memory_is_bounded_by_the_count() -> None:
    """The trace holds `items` records whatever is published, and frees the rest."""
    import tracemalloc

    trace = TraceLog(1000, None)
    tracemalloc.start()
    try:
        for i in range(5000):
            e = entry(10_000 + i)
            writes = written(("tcns", [e.frame]), ("napi", [e.frame]))
            publish(trace, EPOCH, [e], writes, 1.0, 1.0)
            if i == 999:
                full, _ = tracemalloc.get_traced_memory()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(trace) == 1000
    assert after < full * 1.2, (full, after)


def test_a_publisher_that_started_after_the_change_says_so() -> None:
    trace = TraceLog(10, None)  # started after the change: nothing published yet
    gone = trace.find(at(1000), EPOCH, StreamId(1000, 0), 1.0)
    assert gone == NotTraced(
        "NotTraced", "not traced: committed before this publisher began tracing")


@pytest.mark.parametrize("services", [[], ["a"], ["a", "b", "a", "c"]])
def test_one_entry_recorded_by_published_one_reads_as_published_records_it(
    services: list[str],
) -> None:
    """The hub's path for a read of one change (`published_one`, each connection written its
    frame once) records what `published` records for the same writes."""
    one, many = TraceLog(10, None), TraceLog(10, None)
    e = entry(5)
    writes = written(*((service, [e.frame]) for service in services))
    publish(many, EPOCH, [e], writes, 1.0, 1.5)
    one.published_one(EPOCH, e.position, list(writes), 1.0, 1.5)
    head = e.position
    assert (record_body(found(one, at(5), head), at(5), "p")
            == record_body(found(many, at(5), head), at(5), "p"))
    assert sorted(found(one, at(5), head).services) == sorted(set(services))
