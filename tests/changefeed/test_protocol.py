"""The wire protocol, cursors, backoff and the window: pure code, no event loop."""

from __future__ import annotations

import random

import orjson
import pytest

from changefeed.backoff import Backoff
from changefeed.cursor import Position, StreamId
from changefeed.errors import CursorError, ProtocolError, RegistrationError
from changefeed.protocol import (
    ChangeItem,
    ChangeKind,
    Registration,
    Resource,
    accept_version,
    close_frame,
    close_reason,
    decode_item,
    parse_registration,
    registration_reply,
    text_frame,
)
from changefeed.watch import EVERYTHING, Watch
from publisher.delivery.window import Window, WindowEntry

RESOURCES = {
    "vm": Resource("vm", ("nic", "alias"), "/vms"),
    "network": Resource("network", ("ips",), "/networks"),
}
V1 = {
    "instance": "i-1",
    "service": "tcns",
    "changeKind": {"resource": "vm", "subResources": ["nic"]},
}


@pytest.mark.parametrize(
    ("header", "version"),
    [(None, 1), ("", 1), ("~1", 1), ("1.5.4", 1), ("~2", 2), ("2", 2), ("^2.0", 2), ("*", 1)],
)
def test_accept_version(header: str | None, version: int) -> None:
    assert accept_version(header) == version


def test_accept_version_unknown() -> None:
    with pytest.raises(RegistrationError, match="unsupported Accept-Version '~3'"):
        accept_version("~3")


def test_v1_and_v2_registrations_parse() -> None:
    reg = parse_registration(orjson.dumps({**V1, "since": "x"}), 1, RESOURCES)
    assert reg.kinds == (ChangeKind("vm", ("nic",)),) and reg.since == "x"
    reg2 = parse_registration(
        orjson.dumps(
            {
                "instance": "i",
                "service": "s",
                "resources": [
                    {"resource": "vm", "subResources": ["*"]},
                    {"resource": "network", "subResources": ["ips"]},
                ],
            }
        ),
        2,
        RESOURCES,
    )
    assert [k.resource for k in reg2.kinds] == ["vm", "network"]
    assert registration_reply(reg2, RESOURCES, "c", False) == {
        "bootstrapRoutes": [r.to_wire() for r in RESOURCES.values()],
        "cursor": "c",
        "resumed": False,
    }
    assert registration_reply(reg, RESOURCES, "c", True)["bootstrapRoute"] == "/vms"


@pytest.mark.parametrize(
    ("frame", "version", "reason"),
    [
        (b"{nope", 1, "not valid JSON"),
        (b"[1, 2]", 1, "must be a JSON object"),
        (orjson.dumps({**V1, "instance": 7}), 1, "instance: a non-empty string"),
        (orjson.dumps({k: v for k, v in V1.items() if k != "instance"}), 1, "instance"),
        (
            orjson.dumps({**V1, "changeKind": {"resource": "disk", "subResources": ["a"]}}),
            1,
            "unknown resource 'disk'",
        ),
        (
            orjson.dumps({**V1, "changeKind": {"resource": "vm", "subResources": ["cpu"]}}),
            1,
            "unknown sub-resource 'cpu'",
        ),
        (
            orjson.dumps({**V1, "changeKind": {"resource": "vm", "subResources": []}}),
            1,
            "non-empty list",
        ),
        (orjson.dumps({"instance": "i", "resources": []}), 2, "resources is empty"),
        (orjson.dumps(V1), 2, "needs resources"),
        (
            orjson.dumps(
                {"instance": "i", "resources": [{"resource": "vm", "subResources": ["nic"]}]}
            ),
            1,
            "needs changeKind",
        ),
        (orjson.dumps({**V1, "since": 5}), 1, "since must be a cursor string"),
        (orjson.dumps({**V1, "coalesce": "yes"}), 1, "coalesce must be true or false, not 'yes'"),
        (orjson.dumps({**V1, "coalesce": 1}), 1, "coalesce must be true or false, not 1"),
        (orjson.dumps({**V1, "coalesce": None}), 1, "coalesce must be true or false, not None"),
        (
            orjson.dumps({**V1, "changeKind": {**V1["changeKind"], "ids": "a"}}),  # type: ignore[dict-item]
            1,
            "changeKind.ids must be a list of strings",
        ),
        (
            orjson.dumps(
                {"instance": "i", "resources": [
                    {"resource": "network", "subResources": ["ips"]},
                    {"resource": "vm", "subResources": ["nic"], "prefixes": ["ok", ""]},
                ]}
            ),
            2,
            "resources[1].prefixes must hold non-empty strings, not ''",
        ),
    ],
)
def test_invalid_registrations(frame: bytes, version: int, reason: str) -> None:
    with pytest.raises(RegistrationError) as info:
        parse_registration(frame, version, RESOURCES)
    assert info.value.close_code == 1008
    assert reason in info.value.reason


def test_the_coalesce_flag_is_optional_and_echoed_when_asked_for() -> None:
    plain = parse_registration(orjson.dumps(V1), 1, RESOURCES)
    assert plain.coalesce is False and "coalesce" not in plain.to_wire()
    assert "coalesce" not in registration_reply(plain, RESOURCES, "c", False)
    asked = parse_registration(orjson.dumps({**V1, "coalesce": True}), 1, RESOURCES)
    assert asked.coalesce is True and asked.to_wire()["coalesce"] is True
    assert registration_reply(asked, RESOURCES, "c", False)["coalesce"] is True
    off = parse_registration(orjson.dumps({**V1, "coalesce": False}), 1, RESOURCES)
    assert off.coalesce is False


def test_coalesced_items_keep_the_item_shape_and_round_trip() -> None:
    plain = ChangeItem("vm", ("nic",), "v1", 5, "c1")
    assert set(plain.to_wire()) == {"changeKind", "changedResourceId", "published", "cursor"}
    for item in (ChangeItem("vm", ("nic", "alias"), "v1", 5, "c1", coalesced=True),
                 ChangeItem("vm", ("nic",), "v1", 5, "c1", coalesced=True, caught_up=True)):
        wire = item.to_wire()
        assert wire["coalesced"] is True and wire.get("caughtUp", False) is item.caught_up
        assert decode_item(orjson.loads(item.encode())) == item
    with pytest.raises(ProtocolError, match="malformed"):
        decode_item({**plain.to_wire(), "coalesced": "yes"})
    # caughtUp alone (without coalesced) means nothing
    assert decode_item({**plain.to_wire(), "caughtUp": True}).caught_up is False


def test_matching_and_wildcard() -> None:
    assert ChangeKind("vm", ("nic", "alias")).matches(["alias", "state"])
    assert not ChangeKind("vm", ("nic",)).matches(["alias"])
    assert ChangeKind("vm", ("*",)).matches(["anything"])


@pytest.mark.parametrize(
    ("kind", "subs", "id", "matches"),
    [
        (ChangeKind("vm", ("nic",)), ("nic",), "anything", True),
        (ChangeKind("vm", ("nic",), Watch.of(prefixes=["servers"])), ("nic",), "servers/1", True),
        (ChangeKind("vm", ("nic",), Watch.of(prefixes=["servers"])), ("nic",), "serversX", False),
        (ChangeKind("vm", ("nic",), Watch.of(prefixes=["servers"])), ("state",), "servers", False),
        (ChangeKind("vm", ("*",), Watch.of(ids=["a"])), ("state",), "a", True),
        (ChangeKind("vm", ("*",), Watch.of(ids=["a"])), ("state",), "a/b", False),
    ],
)
def test_an_item_matches_a_kind_by_sub_resources_and_watch(
    kind: ChangeKind, subs: tuple[str, ...], id: str, matches: bool
) -> None:
    assert kind.matches_item(subs, id) is matches


def test_a_triton_registration_has_no_watch_and_its_wire_form_is_unchanged() -> None:
    reg = parse_registration(orjson.dumps(V1), 1, RESOURCES)
    assert reg.kinds[0].watch == EVERYTHING and reg.kinds[0].watch.everything
    assert reg.to_wire() == V1


def test_watches_parse_and_go_back_on_the_wire() -> None:
    frame = {
        "instance": "i",
        "service": "s",
        "resources": [
            {"resource": "vm", "subResources": ["nic"], "ids": ["b", "a"], "prefixes": ["s/"]},
            {"resource": "network", "subResources": ["*"], "prefixes": ["net"]},
        ],
    }
    reg = parse_registration(orjson.dumps(frame), 2, RESOURCES)
    assert reg.kinds == (
        ChangeKind("vm", ("nic",), Watch.of(ids=["a", "b"], prefixes=["s"])),
        ChangeKind("network", ("*",), Watch.of(prefixes=["net"])),
    )
    assert reg.to_wire()["resources"] == [
        {"resource": "vm", "subResources": ["nic"], "ids": ["a", "b"], "prefixes": ["s"]},
        {"resource": "network", "subResources": ["*"], "prefixes": ["net"]},
    ]
    assert parse_registration(orjson.dumps(reg.to_wire()), 2, RESOURCES) == reg
    v1 = Registration("i", "s", reg.kinds[:1], 1)
    assert v1.to_wire()["changeKind"] == {
        "resource": "vm", "subResources": ["nic"], "ids": ["a", "b"], "prefixes": ["s"]
    }


def test_frames() -> None:
    for size in (0, 125, 126, 65535, 65536, 70000):
        frame = text_frame(b"x" * size)
        assert frame[0] == 0x81 and frame.endswith(b"x" * size)
        assert len(frame) == size + (2 if size < 126 else 4 if size < 65536 else 10)
    assert close_frame(4008, "slow") == b"\x88\x06\x0f\xa8slow"
    assert len(close_reason("é" * 100).encode()) <= 123


def test_cursor_round_trip_and_order() -> None:
    ids = [
        StreamId(0, 0),
        StreamId(1, 0),
        StreamId(1, 15),
        StreamId(1, 16),
        StreamId(1, 2**40),
        StreamId(1730000000000, 3),
        StreamId(1730000000001, 0),
    ]
    cursors = [Position.single("abcdefgh", sid).encode() for sid in ids]
    assert cursors == sorted(cursors), "cursors of one epoch sort as strings in log order"
    assert [Position.decode(c).position for c in cursors] == ids
    for bad in (
        "",
        "nope",
        "abcdefgh.0192f3a4b5c6",
        "abcdefgh.0192f3a4b5c6b1",
        "ABCDEFGH.0192f3a4b5c6a1",
    ):
        with pytest.raises(CursorError):
            Position.decode(bad)


def test_backoff_grows_to_its_maximum_with_jitter() -> None:
    delays = list(
        Backoff(initial=1, maximum=8, factor=2, jitter=0.5, retries=6).delays(random.Random(1))
    )
    assert len(delays) == 6
    for delay, ceiling in zip(delays, [1, 2, 4, 8, 8, 8], strict=True):
        assert ceiling / 2 <= delay <= ceiling
    exact = list(Backoff(initial=1, maximum=4, jitter=0, retries=4).delays())
    assert exact == [1, 2, 4, 4]
    with pytest.raises(ValueError):
        Backoff(initial=0)


def _entry(ms: int) -> WindowEntry:
    return WindowEntry(StreamId(ms, 0), "vm", ("nic",), str(ms), b"", b"")


def test_window_keeps_the_newest_entries_and_knows_what_it_covers() -> None:
    window = Window(3, StreamId(0, 0))
    for ms in range(1, 6):
        window.append(_entry(ms))
    assert len(window) == 3 and window.head == StreamId(5, 0) and window.base == StreamId(2, 0)
    assert window.covers(StreamId(2, 0)) and not window.covers(StreamId(1, 0))
    assert [e.position.ms for e in window.after(StreamId(3, 0))] == [4, 5]
    assert window.behind(StreamId(2, 0)) == 3
    with pytest.raises(ValueError):
        window.append(_entry(5))
    window.reset(StreamId(0, 0))
    assert len(window) == 0 and window.after(StreamId(0, 0)) == []


def test_registrations_of_the_same_kinds_share_them_and_the_cache_stays_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Thousands of idle listeners registering the same kinds hold one ChangeKind (and one
    watch-everything) between them; kinds past the cache's bound are parsed all the same."""
    import changefeed.protocol as protocol

    first = parse_registration(orjson.dumps(V1), 1, RESOURCES)
    second = parse_registration(orjson.dumps({**V1, "instance": "i-2"}), 1, RESOURCES)
    assert first.kinds[0] is second.kinds[0]
    assert first.kinds[0].watch is EVERYTHING
    watched = {**V1, "changeKind": {"resource": "vm", "subResources": ["nic"], "ids": ["a"]}}
    assert parse_registration(orjson.dumps(watched), 1, RESOURCES).kinds[0] is not first.kinds[0]

    monkeypatch.setattr(protocol, "_KINDS", {})
    monkeypatch.setattr(protocol, "KINDS_INTERNED", 1)
    kept = parse_registration(orjson.dumps(V1), 1, RESOURCES).kinds[0]
    other = {**V1, "changeKind": {"resource": "vm", "subResources": ["alias"]}}
    past = [parse_registration(orjson.dumps(other), 1, RESOURCES).kinds[0] for _ in range(2)]
    assert past[0] == past[1] and past[0] is not past[1], "not interned past the bound"
    assert parse_registration(orjson.dumps(V1), 1, RESOURCES).kinds[0] is kept
    assert len(protocol._KINDS) == 1
