"""The pull consumer's decisions, driven synchronously: no event loop, no sockets, no clock."""

from __future__ import annotations

from typing import Any

import pytest

from changefeed.backoff import Backoff
from changefeed.errors import (
    HeartbeatMissed,
    ItemsMissed,
    PullFailed,
    PullRejected,
    RetriesExhausted,
)
from changefeed.longpoll import EventFilter, EventsQuery, EventsReply
from changefeed.protocol import ChangeItem
from changefeed.retry import Retrier
from listener.consumer_options import consume_options, fetch_options
from listener.consumer_state import Batch, ConsumeCore, ConsumeState, FetchCore, item_size

URL = "http://pub:8080/changefeeds/events"
STEADY = Backoff(initial=1, maximum=1, jitter=0)
VMS = EventFilter("vm")


def item(n: int, id: str | None = None) -> ChangeItem:
    return ChangeItem("vm", ("nic",), id or f"vm-{n}", 1000 + n, f"e.{n:04}")


def reply(*numbers: int, more: bool = False) -> EventsReply:
    return EventsReply(tuple(item(n) for n in numbers), more, "e.0001", "e.9999", False)


def empty() -> EventsReply:
    return EventsReply((), False, "", "", False)


def request(after: str | None, max_results: int, wait_time: float) -> EventsQuery:
    """The request a core of `VMS` makes."""
    return EventsQuery(VMS, after, max_results, wait_time)


def fetch(max_messages: int, after: str | None = None, now: float = 0, **options: Any
          ) -> FetchCore:
    return FetchCore(fetch_options(max_messages, **options), VMS, after, Retrier(STEADY), now)


# --- the batch and max_bytes --------------------------------------------------------------------


def test_max_bytes_keeps_what_fits_and_at_least_one() -> None:
    size = item_size(item(1))
    batch = Batch(None, 3 * size)
    assert batch.wanted() == max(1, 3 * size // 256)  # before any item: a guess
    assert batch.add([item(1), item(2)]) == 2
    assert batch.wanted() == 1  # the room over the largest item seen
    assert batch.add([item(3), item(4), item(5)]) == 1  # the surplus is dropped
    assert batch.full and batch.bytes == 3 * size
    assert [i.cursor for i in batch] == ["e.0001", "e.0002", "e.0003"]
    one_big = Batch(None, 10)
    assert one_big.add([item(1), item(2)]) == 1  # bigger than the limit: alone, never stuck
    assert one_big.full
    assert one_big.pop() == item(1) and not one_big.full and one_big.bytes == 0


def test_a_dropped_item_blocks_pulls_until_there_is_room_for_it() -> None:
    small, big = item(1), item(2, id="v" * 200)
    batch = Batch(None, item_size(small) + item_size(big) - 1)
    assert batch.add([small, big]) == 1
    assert batch.full  # room left, but not for the next item: pulling would only drop it again
    batch.pop()
    assert batch.wanted() >= 1


# --- fetch ------------------------------------------------------------------------------------


def test_fetch_returns_once_it_has_items_and_the_publisher_no_more() -> None:
    core = fetch(10, "e.0000", 0, expires=5)
    pull = core.pull(0)
    assert pull == request("e.0000", 10, 2.5)
    assert core.heartbeat_deadline == 5.0  # twice the idle heartbeat
    core.received(reply(1, 2, 3, more=True), 0.1)
    assert core.heartbeat_deadline is None
    assert core.pull(0.1) == request("e.0003", 7, 2.5)  # more eligible items: ask for the rest
    core.received(reply(4), 0.2)
    assert core.pull(0.2) is None
    assert [i.cursor for i in core.result()] == ["e.0001", "e.0002", "e.0003", "e.0004"]
    assert core.pulls == 2


def test_fetch_long_polls_until_it_expires() -> None:
    core = fetch(10, None, 100, expires=5)
    assert core.pull(100) == request(None, 10, 2.5)
    core.received(empty(), 102.5)  # a heartbeat
    assert core.pull(102.5) == request(None, 10, 2.5)
    core.received(empty(), 104)  # the poll ended early (a bucket event)
    assert core.pull(104) == request(None, 10, 1.0)  # never past expires
    core.received(empty(), 105)
    assert core.pull(105) is None and core.result() == []


def test_fetch_stops_when_full() -> None:
    core = fetch(2, None, 0, expires=5)
    assert core.pull(0) == request(None, 2, 2.5)
    core.received(reply(1, 2, more=True), 0)
    assert core.pull(0) is None and len(core.result()) == 2


def test_fetch_retries_within_expires_then_raises_the_failure() -> None:
    core = fetch(5, None, 0, expires=3)
    core.pull(0)
    failure = PullFailed(URL, "ConnectionRefusedError")
    assert core.failed(failure, 0.1) == 1.0
    assert core.pull(1.1) == request(None, 5, 1.5)
    assert core.failed(failure, 2.5) is None  # the next try would come after expires
    assert core.pull(2.5) is None
    with pytest.raises(PullFailed):
        core.result()


def test_a_failure_after_some_items_ends_the_fetch_with_them() -> None:
    core = fetch(5, None, 0, expires=30)
    core.pull(0)
    core.received(reply(1, more=True), 0)
    core.pull(0)
    assert core.failed(HeartbeatMissed(URL, 30), 30) is None
    assert core.result() == [item(1)]


def test_fetch_raises_items_missed_with_the_oldest_cursor() -> None:
    core = fetch(5, "e.0001", 0, expires=30)
    core.pull(0)
    core.received(EventsReply((), False, "e.0040", "e.0050", True, "trimmed"), 0)
    assert core.pull(0) is None
    with pytest.raises(ItemsMissed) as caught:
        core.result()
    assert (caught.value.cursor, caught.value.oldest, caught.value.reason) == (
        "e.0001", "e.0040", "trimmed")


def test_a_reply_telling_the_position_in_a_new_epoch_moves_the_fetch_there() -> None:
    core = fetch(5, "old.0001", 0, expires=30)
    core.pull(0)
    core.received(EventsReply((), False, "new.0001", "new.0002", True, "new epoch",
                              "new.0001"), 0)
    assert core.failure is None
    again = core.pull(0)
    assert again is not None and again.after == "new.0001"
    core.received(EventsReply((item(2),), False, "new.0001", "new.0002"), 0)
    assert [i.cursor for i in core.result()] == [item(2).cursor]


def test_a_consume_told_its_position_in_a_new_epoch_keeps_it_as_its_cursor() -> None:
    core = ConsumeCore(consume_options(10, None, None, None, 30, None), VMS, "old.0001",
                       Retrier(STEADY))
    core.pull(0)
    core.received(EventsReply((), False, "new.0001", "new.0002", True, "new epoch",
                              "new.0001"), 0)
    assert core.failure is None and core.cursor == "new.0001"
    again = core.pull(0)
    assert again is not None and again.after == "new.0001"


def test_a_rejected_pull_is_not_retried() -> None:
    core = fetch(5, None, 0, expires=30)
    core.pull(0)
    assert core.failed(PullRejected(URL, 400, "InvalidParameter", "after: bad"), 0) is None
    with pytest.raises(PullRejected):
        core.result()


# --- consume ----------------------------------------------------------------------------------


def consume(**options: Any) -> ConsumeCore:
    backoff = options.pop("backoff", STEADY)
    after = options.pop("after", None)
    return ConsumeCore(consume_options(**options), VMS, after, Retrier(backoff))


def test_consume_refills_at_the_threshold_with_what_fits() -> None:
    core = consume(max_messages=10, threshold_messages=4, expires=4)
    assert core.pull(0) == request(None, 10, 2.0)
    assert core.pull(0) is None  # one request at a time
    assert core.received(reply(*range(1, 11)), 0) == 10
    taken = []
    for _ in range(5):
        assert core.pull(0) is None  # above the threshold: no pull
        taken.append(core.take())
    assert len(core.buffer) == 5 and core.pull(0) is None
    taken.append(core.take())  # 4 left: the low watermark
    assert core.pull(0) == request("e.0010", 6, 2.0)  # asks for what fits
    assert core.cursor == "e.0006" and [i.cursor for i in taken if i] == [
        f"e.{n:04}" for n in range(1, 7)]
    core.received(reply(11, 12, 13, 14, 15, 16), 0)
    assert len(core.buffer) == 10 and core.pull(0) is None
    assert core.pulls == 2


def test_max_messages_one_does_not_stall() -> None:
    core = consume(max_messages=1)
    assert core.options.threshold_messages == 0
    for n in range(1, 51):
        pull = core.pull(0)
        assert pull is not None and pull.max_results == 1
        core.received(reply(n), 0)
        assert core.pull(0) is None  # full
        assert core.take() == item(n)
    assert core.pulls == 50 and core.cursor == "e.0050"


def test_consume_by_bytes_drops_the_surplus_and_asks_after_what_it_kept() -> None:
    size = item_size(item(1))
    core = consume(max_bytes=4 * size, threshold_bytes=size)
    first = core.pull(0)
    assert first is not None and first.max_results == max(1, 4 * size // 256)
    assert core.received(reply(1, 2, 3, 4, 5, 6), 0) == 4
    assert core.buffer.bytes == 4 * size and core.pull(0) is None
    core.take()
    core.take()
    assert core.pull(0) is None  # 2 items' bytes: above the threshold
    core.take()
    assert core.pull(0) == request("e.0004", 3, 15.0)  # after the last item kept, not received


def test_empty_answers_are_heartbeats_and_a_silent_one_is_reported_then_pulled_again() -> None:
    core = consume(expires=2)  # idle heartbeat 1 s
    assert core.pull(10) == request(None, 500, 1.0)
    assert core.heartbeat_deadline == 12.0
    core.received(empty(), 11)
    assert core.heartbeat_deadline is None
    assert core.pull(11) is not None and core.heartbeat_deadline == 13.0
    assert core.failed(HeartbeatMissed(URL, core.heartbeat_window), 13) == 0  # at once
    assert core.state is ConsumeState.RUNNING and core.failure is None
    assert core.pull(13) == request(None, 500, 1.0)


def test_missed_heartbeats_do_not_spend_the_retry_budget() -> None:
    """ADR-37 calls a missed heartbeat a warning: a publisher that stays silent for a while must
    not end a consume whose backoff allows one retry."""
    core = consume(expires=2, backoff=Backoff(initial=1, jitter=0, retries=1))
    for now in range(0, 40, 2):
        assert core.pull(now) is not None
        assert core.failed(HeartbeatMissed(URL, core.heartbeat_window), now + 2) == 0
    assert core.failure is None and core.retrier.failures == 0
    core.pull(40)
    assert core.failed(PullFailed(URL, "reset"), 40) == 1  # the one retry is still there
    core.pull(41)
    assert core.failed(PullFailed(URL, "reset"), 41) is None
    assert isinstance(core.failure, RetriesExhausted) and core.failure.attempts == 2


def test_a_missed_heartbeat_is_retried_within_a_fetch() -> None:
    core = fetch(5, None, 0, expires=10)  # idle heartbeat 5 s
    core.pull(0)
    assert core.failed(HeartbeatMissed(URL, 10), 9) == 0  # 1 s left: pull again at once
    assert core.pull(9) == request(None, 5, 1.0)


def test_failures_back_off_and_an_answer_resets_the_backoff() -> None:
    core = consume(backoff=Backoff(initial=1, maximum=8, jitter=0))
    refused = PullFailed(URL, "ConnectionRefusedError")
    delays = []
    for _ in range(3):
        core.pull(0)
        delays.append(core.failed(refused, 0))
    assert delays == [1, 2, 4] and core.retrier.failures == 3
    core.pull(0)
    core.received(reply(1), 0)
    core.pull(0)
    assert core.retrier.failures == 0 and core.failed(refused, 0) == 1


def test_retries_exhausted_ends_the_consume_after_the_buffer() -> None:
    core = consume(max_messages=4, threshold_messages=4, backoff=Backoff(initial=1, retries=1))
    core.pull(0)
    core.received(reply(1), 0)
    core.pull(0)
    assert core.failed(PullFailed(URL, "reset"), 0) == pytest.approx(1, abs=0.5)
    core.pull(0)
    assert core.failed(PullFailed(URL, "reset"), 0) is None
    assert core.pull(0) is None and not core.finished
    assert core.take() == item(1)
    with pytest.raises(RetriesExhausted):
        core.take()
    assert core.finished and core.take() is None


def test_items_missed_is_raised_after_the_items_already_buffered() -> None:
    core = consume(max_messages=4, threshold_messages=4, after="e.0000")
    core.pull(0)
    core.received(reply(1, 2), 0)
    core.pull(0)
    core.received(EventsReply((), False, "e.0040", "e.0050", True, "trimmed"), 0)
    assert [core.take(), core.take()] == [item(1), item(2)]
    with pytest.raises(ItemsMissed) as caught:
        core.take()
    assert caught.value.cursor == "e.0002" and caught.value.oldest == "e.0040"


def test_stop_drops_the_buffer_and_keeps_the_cursor_at_the_last_delivered() -> None:
    core = consume(max_messages=10, after="e.0000")
    core.pull(0)
    core.received(reply(1, 2, 3), 0)
    assert core.take() == item(1)
    core.stop()
    assert core.finished and core.take() is None and core.pull(0) is None
    assert core.cursor == "e.0001" and len(core.buffer) == 0


def test_drain_delivers_the_buffer_pulls_no_more_then_ends() -> None:
    core = consume(max_messages=10)
    core.pull(0)
    core.received(reply(1, 2, 3), 0)
    core.pull(0)  # in flight when draining: its answer is not kept
    core.drain()
    assert core.state is ConsumeState.DRAINING and not core.finished
    assert core.received(reply(4), 0) == 0
    assert [core.take() for _ in range(3)] == [item(1), item(2), item(3)]
    assert core.pull(0) is None
    assert core.take() is None and core.finished and core.cursor == "e.0003"
