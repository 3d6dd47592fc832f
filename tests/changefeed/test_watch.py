"""Watches by id and id prefix: what a watch sees, and how watches are parsed (tables)."""

from __future__ import annotations

from typing import Any

import pytest

from changefeed.watch import EVERYTHING, MAX_WATCHED, Watch, parse_watch, prefixes_of

W = Watch.of

# --- what a watch sees ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("watch", "id", "sees"),
    [
        # A prefix sees itself and whole path segments under it.
        (W(prefixes=["servers"]), "servers", True),
        (W(prefixes=["servers"]), "servers/1", True),
        (W(prefixes=["servers"]), "servers/2", True),
        (W(prefixes=["servers"]), "servers/1/nic", True),
        (W(prefixes=["servers"]), "servers/", True),
        (W(prefixes=["servers"]), "serversX", False),
        (W(prefixes=["servers"]), "servers-1", False),
        (W(prefixes=["servers"]), "server", False),
        (W(prefixes=["servers"]), "Servers/1", False),
        (W(prefixes=["servers"]), "racks/servers/1", False),
        (W(prefixes=["servers"]), "", False),
        # A trailing slash is dropped: the same watch.
        (W(prefixes=["servers/"]), "servers", True),
        (W(prefixes=["servers/"]), "servers/1", True),
        (W(prefixes=["servers//"]), "servers/1", True),
        (W(prefixes=["servers/"]), "serversX", False),
        # Deeper prefixes.
        (W(prefixes=["servers/1"]), "servers/1", True),
        (W(prefixes=["servers/1"]), "servers/1/nic/0", True),
        (W(prefixes=["servers/1"]), "servers/10", False),
        (W(prefixes=["servers/1"]), "servers", False),
        (W(prefixes=["servers/1"]), "servers/2", False),
        # Ids are exact.
        (W(ids=["servers/1"]), "servers/1", True),
        (W(ids=["servers/1"]), "servers/1/nic", False),
        (W(ids=["servers/1"]), "servers", False),
        (W(ids=["servers/1"]), "servers/10", False),
        (W(ids=["servers/"]), "servers/", True),
        (W(ids=["servers/"]), "servers", False),
        # Ids and prefixes together: either.
        (W(ids=["a"], prefixes=["b"]), "a", True),
        (W(ids=["a"], prefixes=["b"]), "b/c", True),
        (W(ids=["a"], prefixes=["b"]), "a/c", False),
        (W(ids=["a"], prefixes=["b"]), "c", False),
        # Odd but legal ids.
        (W(prefixes=["/abs"]), "/abs/x", True),
        (W(prefixes=["a b"]), "a b/ü", True),
        (W(prefixes=["ü"]), "ü/1", True),
        (W(prefixes=["a//b"]), "a//b/c", True),
        (W(prefixes=["a"]), "a//b", True),
        # Empty: everything.
        (W(), "anything/at/all", True),
        (EVERYTHING, "", True),
    ],
)
def test_what_a_watch_sees(watch: Watch, id: str, sees: bool) -> None:
    assert watch.matches(id) is sees
    if not watch.everything:
        # The hub's index finds prefix watches by walking the id's prefixes: the same answer.
        walked = id in watch.ids or any(p in watch.prefixes for p in prefixes_of(id))
        assert walked is sees


@pytest.mark.parametrize(
    ("id", "prefixes"),
    [
        ("servers", ["servers"]),
        ("servers/1/nic", ["servers", "servers/1", "servers/1/nic"]),
        ("a//b", ["a", "a/", "a//b"]),
        ("/x", ["", "/x"]),
        ("x/", ["x", "x/"]),
    ],
)
def test_prefixes_of_walks_up_the_hierarchy(id: str, prefixes: list[str]) -> None:
    assert list(prefixes_of(id)) == prefixes


def test_watch_values_and_wire_forms() -> None:
    watch = W(ids=["b", "a", "a"], prefixes=["servers/", "servers", "racks"])
    assert watch.ids == {"a", "b"} and watch.prefixes == ("servers", "racks")
    assert watch.to_wire() == {"ids": ["a", "b"], "prefixes": ["servers", "racks"]}
    assert watch.to_query() == [
        ("id", "a"), ("id", "b"), ("prefix", "servers"), ("prefix", "racks")
    ]
    assert W(prefixes=["p"]).to_wire() == {"prefixes": ["p"]}
    assert EVERYTHING.to_wire() == {} and EVERYTHING.to_query() == []
    assert W() == EVERYTHING and W().everything and not watch.everything


@pytest.mark.parametrize(
    ("ids", "prefixes", "watch"),
    [
        (None, None, EVERYTHING),
        ([], [], EVERYTHING),
        (["a", "a"], None, W(ids=["a"])),
        (None, ["servers/", "servers"], W(prefixes=["servers"])),
        (["x"], ["y"], W(ids=["x"], prefixes=["y"])),
        (["x" * 512], None, W(ids=["x" * 512])),
    ],
)
def test_parse_watch_accepts(ids: Any, prefixes: Any, watch: Watch) -> None:
    assert parse_watch(ids, prefixes, "resources[0].") == watch


@pytest.mark.parametrize(
    ("ids", "prefixes", "message"),
    [
        ("a", None, "resources[0].ids must be a list of strings"),
        ({"a": 1}, None, "resources[0].ids must be a list of strings"),
        (None, "servers", "resources[0].prefixes must be a list of strings"),
        ([1], None, "resources[0].ids must hold non-empty strings, not 1"),
        ([""], None, "resources[0].ids must hold non-empty strings, not ''"),
        (None, [None], "resources[0].prefixes must hold non-empty strings, not None"),
        (None, ["/"], "resources[0].prefixes must not hold an empty prefix ('/')"),
        (None, ["//"], "resources[0].prefixes must not hold an empty prefix ('//')"),
        (["é" * 257], None, "resources[0].ids holds an id longer than 512 bytes"),
        (
            ["i"] * 600,
            ["p"] * (MAX_WATCHED - 599),
            f"resources[0].ids and resources[0].prefixes name more than {MAX_WATCHED} entries",
        ),
    ],
)
def test_parse_watch_refuses(ids: Any, prefixes: Any, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_watch(ids, prefixes, "resources[0].")
    assert str(raised.value).startswith(message)


def test_parse_watch_names_the_fields_as_the_caller_calls_them() -> None:
    with pytest.raises(ValueError, match=r"^id must hold non-empty strings"):
        parse_watch([""], [], names=("id", "prefix"))
    with pytest.raises(ValueError, match=r"^prefix must not hold an empty prefix"):
        parse_watch([], ["/"], names=("id", "prefix"))
