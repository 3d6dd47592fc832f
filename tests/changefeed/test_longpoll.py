"""The `events` wire format, as both sides speak it: what one writes, the other reads back.

The publisher writes replies (`EventsReply.to_wire`) and reads requests (`from_query`); the
listener writes requests (`EventsQuery.to_query`) and reads replies (`EventsReply.parse`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson
import pytest

from changefeed.cursor import Position, StreamId
from changefeed.errors import ParamError, ProtocolError
from changefeed.longpoll import (
    MAX_RESULTS,
    MAX_WAIT,
    EventFilter,
    EventsQuery,
    EventsReply,
    EventsRequest,
    from_query,
)
from changefeed.protocol import ChangeItem, Resource
from changefeed.watch import Watch

EPOCH = "k2v7q4xa"
RESOURCES = {"vm": Resource("vm", ("nic", "alias", "state"), "/vms"),
             "network": Resource("network", ("ips",), "/networks")}


@dataclass(frozen=True)
class Limits:
    results: int = 100
    max_results: int = MAX_RESULTS
    wait: float = 10.0
    max_wait: float = MAX_WAIT


def cursor(n: int) -> str:
    return Position.single(EPOCH, StreamId(1730000000000 + n, 0)).encode()


def item(n: int, id: str | None = None) -> ChangeItem:
    return ChangeItem("vm", ("nic",), id or f"vm-{n}", 1000 + n, cursor(n))


def parse(params: Sequence[tuple[str, str]], limits: Limits = Limits()) -> EventsRequest:
    """The request the publisher reads from the query string `params`."""
    return from_query(dict(params), lambda name: [v for k, v in params if k == name],
                      RESOURCES, limits)


# --- replies: written by the publisher, read by the listener ----------------------------------


def test_a_reply_written_by_to_wire_parses_back_equal() -> None:
    for reply in (
        EventsReply((item(1), item(2, "a/b c")), True, cursor(1), cursor(9)),
        EventsReply((), False, "", ""),
        EventsReply((), False, cursor(5), cursor(9), True, "trimmed"),
    ):
        assert EventsReply.parse(orjson.dumps(reply.to_wire())) == reply
        assert EventsReply.parse(orjson.dumps(reply.to_wire()).decode()) == reply


def test_an_item_without_its_own_cursor_takes_the_entry_s() -> None:
    value = item(7).to_wire()
    body = orjson.dumps({
        "items": [{"cursor": cursor(7), "data": {"type": "change", "value": value}},
                  {"cursor": cursor(8), "data": {"type": "change",
                                                 "value": {**value, "cursor": ""}}}],
        "more": True, "oldest": cursor(1), "newest": cursor(9), "missed": False,
    })
    parsed = EventsReply.parse(body)
    assert [i.cursor for i in parsed.items] == [cursor(7), cursor(8)]
    assert parsed.items[0] == item(7)
    assert (parsed.more, parsed.oldest, parsed.newest, parsed.missed) == (
        True, cursor(1), cursor(9), False)


def test_missing_optional_fields_read_as_empty() -> None:
    assert EventsReply.parse(b'{"items": []}') == EventsReply((), False, "", "")
    assert EventsReply.parse(b'{"items": [], "oldest": 5, "missed": "yes"}') == EventsReply(
        (), False, "", "")


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"more": false}',
        b'{"items": {}}',
        b'{"items": [5]}',
        b'{"items": [{"cursor": "e.1", "data": {"type": "other", "value": {}}}]}',
        b'{"items": [{"cursor": "e.1", "data": {"type": "change", "value": {"x": 1}}}]}',
        b'{"items": [{"cursor": "e.1", "data": {"type": "change", "value": []}}]}',
        # An item without a cursor, neither its own nor the entry's.
        orjson.dumps({"items": [{"data": {"type": "change", "value": {
            **ChangeItem("vm", ("nic",), "a", 1, "").to_wire()}}}]}),
    ],
)
def test_a_garbled_reply_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        EventsReply.parse(body)


# --- queries: written by the listener, read by the publisher ----------------------------------


def test_a_query_parses_back_into_the_same_filter_after_and_max_results() -> None:
    for query in (
        EventsQuery(EventFilter(), None, 1, 0.0001),
        EventsQuery(EventFilter("vm"), cursor(3), 50, 2.5),
        EventsQuery(EventFilter("vm", frozenset({"nic", "alias"}),
                                Watch.of(ids=["b", "a c"], prefixes=["srv/", "r/7"])),
                    cursor(40), MAX_RESULTS, MAX_WAIT),
        EventsQuery(EventFilter(watch=Watch.of(ids=["x"])), None, 10, 30),
    ):
        request = parse(query.to_query())
        assert request.filter == query.filter
        assert (None if request.after is None else request.after.encode()) == query.after
        assert request.max_results == query.max_results
        assert request.before is None and request.oldest_first
        sent = max(0.001, query.wait_time) if query.wait_time > 0 else 0.0
        assert request.wait == pytest.approx(sent, abs=0.0005)


def test_the_wait_is_sent_in_milliseconds_and_zero_only_for_no_wait() -> None:
    """A publisher reads 0 as "answer at once": a tiny wait stays a wait."""
    params = dict(EventsQuery(EventFilter(), None, 1, 0.0001).to_query())
    assert params["wait_time"] == "1ms"
    assert dict(EventsQuery(EventFilter(), None, 1, 0.0).to_query())["wait_time"] == "0ms"
    assert dict(EventsQuery(EventFilter(), None, 1, 2.5).to_query())["wait_time"] == "2500ms"


def test_the_publisher_caps_what_the_query_asks_for() -> None:
    request = parse(EventsQuery(EventFilter(), None, 5000, 600).to_query(), Limits())
    assert (request.max_results, request.wait) == (MAX_RESULTS, MAX_WAIT)


def test_a_query_for_an_unknown_sub_resource_is_refused_by_the_publisher() -> None:
    query = EventsQuery(EventFilter("vm", frozenset({"disk"})), None, 1, 1)
    with pytest.raises(ParamError, match="unknown sub-resource 'disk'"):
        parse(query.to_query())


def test_an_event_filter_matches_resource_sub_resources_and_watch() -> None:
    filter = EventFilter("vm", frozenset({"nic"}), Watch.of(prefixes=["servers"]))
    assert filter.matches(ChangeItem("vm", ("alias", "nic"), "servers/1", 1, ""))
    assert not filter.matches(ChangeItem("vm", ("alias",), "servers/1", 1, ""))
    assert not filter.matches(ChangeItem("vm", ("nic",), "serversX", 1, ""))
    assert not filter.matches(ChangeItem("network", ("nic",), "servers", 1, ""))
    assert EventFilter().matches(ChangeItem("network", ("ips",), "n", 1, ""))
