"""The ZeroEventHub feed's wire format: request parsing (every mistake a ParamError naming the
parameter), cursor resolution, and the NDJSON lines."""

from __future__ import annotations

from dataclasses import dataclass

import orjson
import pytest

from changefeed import feed
from changefeed.cursor import ZERO, Position, StreamId
from changefeed.errors import CursorGone, ParamError
from changefeed.protocol import ChangeItem


@dataclass(frozen=True)
class Limits:
    results: int = 100
    max_results: int = 1000
    wait: float = 10.0
    max_wait: float = 60.0


def parse(**query: str) -> feed.FeedRequest:
    return feed.parse_request(query, Limits())


def test_a_request_with_every_parameter() -> None:
    request = parse(n="2", cursor1="_last", cursor0="_first", pagesizehint="5000",
                    headers="ce_id,ce_time", wait="1500ms", cursorset="main", consumer="billing")
    assert request.n == 2 and list(request.cursors) == [0, 1]
    assert request.page_size == 1000, "capped by maxResults"
    assert request.headers == ("ce_id", "ce_time") and request.wait == 1.5
    assert parse(n="1", cursor0="_first", headers="_all").headers == feed.HEADERS
    resumed = parse(n="2", resume="1,0,1", cursorset="main", consumer="billing")
    assert resumed.resume == (1, 0) and resumed.cursors == {}


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({}, "n .* must be a positive integer"),
        ({"n": "²", "cursor0": "_first"}, "n .* must be a positive integer"),
        ({"n": "0", "cursor0": "_first"}, "n .* must be a positive integer"),
        ({"n": "1", "cursor0": "_first", "pagesizehint": "²"}, "pagesizehint"),
        ({"n": "1", "cursor0": "_first", "pagesizehint": "-1"}, "pagesizehint"),
        ({"n": "1", "resume": "²", "cursorset": "s", "consumer": "c"}, "resume must list"),
        ({"n": "1", "cursor1": "_first"}, "cursor1: partition 1 is not below n=1"),
        ({"n": "1", "cursor0": ""}, "cursor0 must be"),
        ({"n": "1"}, "pass a cursorN"),
        ({"n": "1", "cursor0": "_first", "cursorset": "s"}, "need consumer"),
        ({"n": "1", "cursor0": "_first", "cursorset": "bad name", "consumer": "c"}, "cursorset"),
        ({"n": "1", "resume": "0", "consumer": "c"}, "resume needs cursorset"),
        ({"n": "1", "resume": "0", "cursor0": "_first", "cursorset": "s", "consumer": "c"},
         "either cursorN or resume"),
        ({"n": "1", "cursor0": "_first", "wait": "soon"}, "wait must be"),
    ],
)
def test_bad_requests_name_the_parameter(query: dict[str, str], message: str) -> None:
    with pytest.raises(ParamError, match=message):
        parse(**query)


def test_resolve() -> None:
    head, trimmed = StreamId(50, 0), StreamId(10, 0)
    assert feed.resolve(feed.FIRST, "cursor0", "e" * 8, trimmed, head) == ZERO
    assert feed.resolve(feed.LAST, "cursor0", "e" * 8, trimmed, head) == head
    inside = Position.single("e" * 8, StreamId(20, 1))
    assert feed.resolve(inside.encode(), "cursor0", "e" * 8, trimmed, head) == inside.position
    with pytest.raises(CursorGone, match="another bucket epoch"):
        feed.resolve(inside.encode(), "cursor0", "f" * 8, trimmed, head)
    with pytest.raises(CursorGone, match="older than the retained log"):
        old = Position.single("e" * 8, StreamId(5, 0)).encode()
        feed.resolve(old, "cursor0", "e" * 8, trimmed, head)
    with pytest.raises(ParamError, match="cursor0 must be"):
        feed.resolve("nonsense", "cursor0", "e" * 8, trimmed, head)


def test_lines() -> None:
    cursor = Position.single("e" * 8, StreamId(1_730_000_000_454, 3)).encode()
    item = ChangeItem("vm", ("nic",), "vm-1", 1_730_000_000_454, cursor)
    line = orjson.loads(feed.event_line(2, item, "changefeed", ("ce_id", "ce_time", "ce_source")))
    assert line == {
        "partition": 2,
        "headers": {"ce_id": cursor, "ce_time": "2024-10-27T03:33:20.454Z",
                    "ce_source": "changefeed"},
        "data": item.to_wire(),
    }
    assert "headers" not in orjson.loads(feed.event_line(0, item, "changefeed", ()))
    checkpoint = orjson.dumps({"partition": 1, "cursor": cursor}) + b"\n"
    assert feed.checkpoint_line(1, cursor) == checkpoint
