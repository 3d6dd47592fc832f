"""The pull consumer's decisions, driven synchronously: no event loop, no sockets, no clock."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest

from changefeed.backoff import Backoff
from changefeed.errors import (
    HeartbeatMissed,
    InvalidOption,
    ItemsMissed,
    ListenerError,
    ProtocolError,
    PullFailed,
    PullRejected,
    RetriesExhausted,
)
from changefeed.protocol import ChangeItem
from listener.consumer_state import (
    Batch,
    ConsumeCore,
    ConsumeOptions,
    ConsumeState,
    EventsReply,
    FetchCore,
    Pull,
    Retrier,
    Selection,
    consume_options,
    fetch_options,
    item_size,
    parse_reply,
)

URL = "http://pub:8080/changefeeds/events"
STEADY = Backoff(initial=1, maximum=1, jitter=0)


def item(n: int, id: str | None = None) -> ChangeItem:
    return ChangeItem("vm", ("nic",), id or f"vm-{n}", 1000 + n, f"e.{n:04}")


def reply(*numbers: int, more: bool = False) -> EventsReply:
    return EventsReply(tuple(item(n) for n in numbers), more, "e.0001", "e.9999", False)


def empty() -> EventsReply:
    return EventsReply((), False, "", "", False)


def retrier(backoff: Backoff = STEADY) -> Retrier:
    return Retrier(backoff)


# --- options ----------------------------------------------------------------------------------


def test_consume_defaults_follow_the_adr() -> None:
    assert consume_options() == ConsumeOptions(500, None, 250, None, 30.0, 15.0)
    assert consume_options(max_bytes=1000) == ConsumeOptions(None, 1000, None, 500, 30.0, 15.0)
    assert consume_options(max_messages=1).threshold_messages == 0
    assert consume_options(expires=120).idle_heartbeat == 30.0  # half of expires, capped at 30 s
    assert consume_options(expires=1).idle_heartbeat == 0.5
    assert consume_options(max_messages=10, threshold_messages=10).threshold_messages == 10
    assert fetch_options(5).max_messages == 5 and fetch_options(max_bytes=9).max_bytes == 9


@pytest.mark.parametrize(
    ("arguments", "option"),
    [
        ({"max_messages": 10, "max_bytes": 100}, "max_bytes"),  # exclusive
        ({"max_messages": 0}, "max_messages"),
        ({"max_messages": True}, "max_messages"),
        ({"max_messages": 2.5}, "max_messages"),
        ({"max_bytes": -1}, "max_bytes"),
        ({"max_messages": 10, "threshold_messages": 11}, "threshold_messages"),  # above its limit
        ({"threshold_messages": 501}, "threshold_messages"),  # above the default limit
        ({"threshold_messages": -1}, "threshold_messages"),
        ({"max_bytes": 100, "threshold_bytes": 101}, "threshold_bytes"),
        ({"threshold_bytes": 10}, "threshold_bytes"),  # no max_bytes to apply to
        ({"max_bytes": 100, "threshold_messages": 10}, "threshold_messages"),
        ({"expires": 0.5}, "expires"),  # the ADR's minimum is 1 s
        ({"expires": math.nan}, "expires"),
        ({"expires": "30"}, "expires"),
        ({"idle_heartbeat": 0.4}, "idle_heartbeat"),  # minimum 500 ms
        ({"expires": 100, "idle_heartbeat": 31}, "idle_heartbeat"),  # maximum 30 s
        ({"expires": 10, "idle_heartbeat": 6}, "idle_heartbeat"),  # above expires / 2
    ],
)
def test_consume_options_are_refused_naming_the_option(
    arguments: dict[str, Any], option: str
) -> None:
    with pytest.raises(InvalidOption) as caught:
        consume_options(**arguments)
    assert caught.value.option == option
    assert option in str(caught.value)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, ListenerError)


@pytest.mark.parametrize(
    ("arguments", "option"),
    [
        ({}, "max_messages"),  # one of the two is required
        ({"max_messages": 1, "max_bytes": 1}, "max_bytes"),
        ({"max_messages": 1, "expires": 0}, "expires"),
    ],
)
def test_fetch_options_are_refused_naming_the_option(arguments: dict[str, Any], option: str
                                                     ) -> None:
    with pytest.raises(InvalidOption) as caught:
        fetch_options(**arguments)
    assert caught.value.option == option


# --- selection and replies ----------------------------------------------------------------------


def test_the_query_asks_for_the_oldest_items_after_the_cursor() -> None:
    selection = Selection.of("vm", ["nic", "alias", "nic"], ids=["b", "a"], prefixes=["srv/"])
    assert selection.query(Pull("e.0001", 50, 2.5)) == [
        ("order", "oldest"), ("max_results", "50"), ("wait_time", "2500ms"), ("after", "e.0001"),
        ("resource", "vm"), ("sub", "nic"), ("sub", "alias"), ("id", "a"), ("id", "b"),
        ("prefix", "srv"),
    ]
    # From the start of the log, every resource; a wait never reads as 0 (the server's default).
    assert Selection.of().query(Pull(None, 1, 0.0001)) == [
        ("order", "oldest"), ("max_results", "1"), ("wait_time", "1ms")]


@pytest.mark.parametrize(
    ("arguments", "option"),
    [
        ({"sub_resources": ["nic"]}, "sub_resources"),  # needs a resource
        ({"resource": "vm", "sub_resources": "nic"}, "sub_resources"),  # one string, not a list
        ({"resource": ""}, "resource"),
        ({"ids": [""]}, "ids"),
        ({"prefixes": ["/"]}, "ids/prefixes"),
    ],
)
def test_a_bad_selection_is_refused(arguments: dict[str, Any], option: str) -> None:
    with pytest.raises(InvalidOption) as caught:
        Selection.of(**arguments)
    assert caught.value.option == option


def test_a_reply_is_read_into_change_items() -> None:
    value = item(7).to_wire()
    body = orjson.dumps({
        "items": [{"cursor": "e.0007", "data": {"type": "change", "value": value}},
                  {"cursor": "e.0008", "data": {"type": "change",
                                                "value": {**value, "cursor": ""}}}],
        "more": True, "oldest": "e.0001", "newest": "e.0009", "missed": False,
    })
    parsed = parse_reply(body)
    assert [i.cursor for i in parsed.items] == ["e.0007", "e.0008"]  # the entry's, if need be
    assert parsed.items[0] == item(7)
    assert (parsed.more, parsed.oldest, parsed.newest, parsed.missed) == (
        True, "e.0001", "e.0009", False)
    missed = parse_reply(b'{"items": [], "more": false, "oldest": "e.0005", "newest": "e.0009",'
                         b' "missed": true, "missed_reason": "trimmed"}')
    assert missed.missed and missed.missed_reason == "trimmed" and missed.oldest == "e.0005"


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"more": false}',
        b'{"items": [{"cursor": "e.1", "data": {"type": "other", "value": {}}}]}',
        b'{"items": [{"cursor": "e.1", "data": {"type": "change", "value": {"x": 1}}}]}',
        b'{"items": [5]}',
    ],
)
def test_a_garbled_reply_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_reply(body)


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
    core = FetchCore(fetch_options(10, expires=5), "e.0000", retrier(), now=0)
    pull = core.pull(0)
    assert pull == Pull("e.0000", 10, 2.5)
    assert core.heartbeat_deadline == 5.0  # twice the idle heartbeat
    core.received(reply(1, 2, 3, more=True), 0.1)
    assert core.heartbeat_deadline is None
    assert core.pull(0.1) == Pull("e.0003", 7, 2.5)  # more eligible items: ask for the rest
    core.received(reply(4), 0.2)
    assert core.pull(0.2) is None
    assert [i.cursor for i in core.result()] == ["e.0001", "e.0002", "e.0003", "e.0004"]
    assert core.pulls == 2


def test_fetch_long_polls_until_it_expires() -> None:
    core = FetchCore(fetch_options(10, expires=5), None, retrier(), now=100)
    assert core.pull(100) == Pull(None, 10, 2.5)
    core.received(empty(), 102.5)  # a heartbeat
    assert core.pull(102.5) == Pull(None, 10, 2.5)
    core.received(empty(), 104)  # the poll ended early (a bucket event)
    assert core.pull(104) == Pull(None, 10, 1.0)  # never past expires
    core.received(empty(), 105)
    assert core.pull(105) is None and core.result() == []


def test_fetch_stops_when_full() -> None:
    core = FetchCore(fetch_options(2, expires=5), None, retrier(), now=0)
    assert core.pull(0) == Pull(None, 2, 2.5)
    core.received(reply(1, 2, more=True), 0)
    assert core.pull(0) is None and len(core.result()) == 2


def test_fetch_retries_within_expires_then_raises_the_failure() -> None:
    core = FetchCore(fetch_options(5, expires=3), None, retrier(), now=0)
    core.pull(0)
    failure = PullFailed(URL, "ConnectionRefusedError")
    assert core.failed(failure, 0.1) == 1.0
    assert core.pull(1.1) == Pull(None, 5, 1.5)
    assert core.failed(failure, 2.5) is None  # the next try would come after expires
    assert core.pull(2.5) is None
    with pytest.raises(PullFailed):
        core.result()


def test_a_failure_after_some_items_ends_the_fetch_with_them() -> None:
    core = FetchCore(fetch_options(5, expires=30), None, retrier(), now=0)
    core.pull(0)
    core.received(reply(1, more=True), 0)
    core.pull(0)
    assert core.failed(HeartbeatMissed(URL, 30), 30) is None
    assert core.result() == [item(1)]


def test_fetch_raises_items_missed_with_the_oldest_cursor() -> None:
    core = FetchCore(fetch_options(5, expires=30), "e.0001", retrier(), now=0)
    core.pull(0)
    core.received(EventsReply((), False, "e.0040", "e.0050", True, "trimmed"), 0)
    assert core.pull(0) is None
    with pytest.raises(ItemsMissed) as caught:
        core.result()
    assert (caught.value.cursor, caught.value.oldest, caught.value.reason) == (
        "e.0001", "e.0040", "trimmed")


def test_a_rejected_pull_is_not_retried() -> None:
    core = FetchCore(fetch_options(5, expires=30), None, retrier(), now=0)
    core.pull(0)
    assert core.failed(PullRejected(URL, 400, "InvalidParameter", "after: bad"), 0) is None
    with pytest.raises(PullRejected):
        core.result()


# --- consume ----------------------------------------------------------------------------------


def consume(**options: Any) -> ConsumeCore:
    backoff = options.pop("backoff", STEADY)
    after = options.pop("after", None)
    return ConsumeCore(consume_options(**options), after, Retrier(backoff))


def test_consume_refills_at_the_threshold_with_what_fits() -> None:
    core = consume(max_messages=10, threshold_messages=4, expires=4)
    assert core.pull(0) == Pull(None, 10, 2.0)
    assert core.pull(0) is None  # one request at a time
    assert core.received(reply(*range(1, 11)), 0) == 10
    taken = []
    for _ in range(5):
        assert core.pull(0) is None  # above the threshold: no pull
        taken.append(core.take())
    assert len(core.buffer) == 5 and core.pull(0) is None
    taken.append(core.take())  # 4 left: the low watermark
    assert core.pull(0) == Pull("e.0010", 6, 2.0)  # asks for what fits
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
    assert core.pull(0) == Pull("e.0004", 3, 15.0)  # after the last item kept, not received


def test_empty_answers_are_heartbeats_and_a_silent_one_is_reported_then_pulled_again() -> None:
    core = consume(expires=2)  # idle heartbeat 1 s
    assert core.pull(10) == Pull(None, 500, 1.0)
    assert core.heartbeat_deadline == 12.0
    core.received(empty(), 11)
    assert core.heartbeat_deadline is None
    assert core.pull(11) is not None and core.heartbeat_deadline == 13.0
    assert core.failed(HeartbeatMissed(URL, core.heartbeat_window), 13) == 1.0
    assert core.state is ConsumeState.RUNNING and core.failure is None
    assert core.pull(14) == Pull(None, 500, 1.0)


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
