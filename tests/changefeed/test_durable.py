"""The durable consumers' wire format (changefeed.durable): pure, no server."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from changefeed.cursor import StreamId
from changefeed.durable import (
    Action,
    ConsumerConfig,
    DeliveryId,
    FetchReply,
    Message,
    Outcome,
    Settled,
    SettleReply,
    parse_config,
    parse_fetch,
    parse_settle,
    stored_config,
)
from changefeed.errors import ParamError, ProtocolError
from changefeed.protocol import ChangeItem, Resource

RESOURCES = {"vm": Resource("vm", ("nic", "alias"), "/vms")}


class Limits:
    results = 100
    max_results = 1000
    wait = 10.0
    max_wait = 60.0


def config(body: Any) -> ConsumerConfig:
    return parse_config(body, RESOURCES, max_ack_wait=3600, max_ack_pending=500)


def test_defaults_fill_a_config_and_equal_configs_encode_equally() -> None:
    plain = config({})
    assert plain == ConsumerConfig(max_ack_pending=500)
    assert plain.to_wire() == {"filter": {}, "ack_wait": 30.0, "max_deliver": 5,
                               "max_ack_pending": 500, "start": "first"}
    spelled = config({"filter": {"resource": "vm", "subResources": ["nic", "alias"],
                                 "prefixes": ["servers/"]}, "ack_wait": "1m", "start": "last"})
    again = config({"start": "last", "ack_wait": 60, "filter": {
        "prefixes": ["servers"], "subResources": ["alias", "nic"], "resource": "vm"}})
    assert spelled == again and spelled.encode() == again.encode()
    assert stored_config(spelled.encode(), RESOURCES) == spelled
    assert spelled.differences(plain) == [
        'filter is {"resource":"vm","subResources":["alias","nic"],"prefixes":["servers"]}, '
        "not {}",
        "ack_wait is 60.0, not 30.0",
        'start is "last", not "first"',
    ]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ([], "JSON object"),
        ({"acks": 1}, "unknown key(s) acks"),
        ({"ack_wait": 0}, "ack_wait must be from 0.05"),
        ({"ack_wait": 4000}, "ack_wait must be from 0.05 to 3600"),
        ({"ack_wait": True}, "ack_wait"),
        ({"max_deliver": 1001}, "max_deliver must be an integer from 1 to 1000"),
        ({"max_deliver": "x"}, "max_deliver must be an integer"),
        ({"max_ack_pending": 501}, "from 1 to 500"),
        ({"filter": {"resource": "disk"}}, "filter.resource: unknown resource 'disk'"),
        ({"filter": {"colour": "red"}}, "unknown filter key(s) colour"),
        ({"filter": {"subResources": ["nic"]}}, "needs filter.resource"),
        ({"start": 3}, "start must be"),
        ({"start": "k2v9q4xab2.nope"}, "start must be 'first', 'last' or a cursor"),
    ],
)
def test_a_bad_config_names_the_key(body: Any, words: str) -> None:
    with pytest.raises(ParamError) as error:
        config(body)
    assert words in str(error.value)


def test_delivery_ids_round_trip_and_garbage_is_refused() -> None:
    delivery = DeliveryId("abcdefghij", StreamId(1730000000454, 3), 2)
    assert delivery.encode() == "abcdefghij:1730000000454-3:2"
    assert DeliveryId.decode(delivery.encode()) == delivery
    for bad in ("", "abcdefghij:1-1:0", "ABCDEFGHIJ:1-1:1", "abcdefghij:1:1", 5, None,
                "abcdefghij:1-1:1:1", "abcdefghij:-1-1:1"):
        with pytest.raises(ParamError, match="not a delivery id"):
            DeliveryId.decode(bad)


def test_fetch_requests_take_the_publishers_limits() -> None:
    assert parse_fetch(None, Limits()).max_messages == 100
    assert parse_fetch(None, Limits()).wait == 10.0
    capped = parse_fetch({"max_messages": 5000, "wait_time": "5m"}, Limits())
    assert (capped.max_messages, capped.wait) == (1000, 60.0)
    assert parse_fetch({"wait_time": 0}, Limits()).wait == 0.0
    for body, words in (({"max_messages": 0}, "1 or more"), ({"x": 1}, "unknown key(s) x"),
                        ({"wait_time": "soon"}, "wait_time"), ("[]", "JSON object"),
                        ({"instance": 3}, "instance")):
        with pytest.raises(ParamError, match=words.replace("(", r"\(").replace(")", r"\)")):
            parse_fetch(body, Limits())


def test_settle_requests_are_bounded_and_only_nak_takes_a_delay() -> None:
    ids = ["abcdefghij:1-1:1", "abcdefghij:1-2:3"]
    request = parse_settle({"deliveries": ids, "delay": "250ms"}, Action.NAK, most=10,
                           max_delay=60)
    assert [d.encode() for d in request.deliveries] == ids and request.delay == 0.25
    assert request.to_wire() == {"deliveries": ids, "delay": 0.25}
    with pytest.raises(ParamError, match="at most 1 per request"):
        parse_settle({"deliveries": ids}, Action.ACK, most=1, max_delay=60)
    with pytest.raises(ParamError, match="delay applies to nak only"):
        parse_settle({"deliveries": ids, "delay": 1}, Action.TERM, most=10, max_delay=60)
    with pytest.raises(ParamError, match="delay must be from 0 to 60"):
        parse_settle({"deliveries": ids, "delay": 61}, Action.NAK, most=10, max_delay=60)


def test_replies_round_trip_and_garbage_is_a_protocol_error() -> None:
    item = ChangeItem("vm", ("nic",), "servers/1", 1730000000454, "k2v9q4xab2.0192f3a4b5c6a3")
    reply = FetchReply((Message(item, "abcdefghij:1-1:1", 1),), 3, 1)
    assert FetchReply.parse(orjson.dumps(reply.to_wire())) == reply
    settled = SettleReply((Settled("abcdefghij:1-1:1", Outcome.APPLIED, True),
                           Settled("abcdefghij:1-2:1", Outcome.REDELIVERED)))
    wire = settled.to_wire()
    assert wire["results"][1] == {"delivery": "abcdefghij:1-2:1", "applied": False,
                                  "outcome": "redelivered", "late": False}
    assert SettleReply.parse(orjson.dumps(wire)) == settled
    for body in (b"nope", b"[]", b'{"messages": 1}', b'{"messages": [{"delivery": 1}]}'):
        with pytest.raises(ProtocolError):
            FetchReply.parse(body)
    with pytest.raises(ProtocolError):
        SettleReply.parse(b'{"results": [{"delivery": "x", "outcome": "maybe"}]}')
