"""Watches in the publisher: the hub's index of them, and listeners with different watches on a
real publisher, live and resumed from the retained log (what a watch sees: tests/changefeed)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest

from changefeed.cursor import StreamId
from changefeed.protocol import ChangeKind, Registration
from changefeed.watch import Watch
from publisher.bucket import Change, LogEntry
from publisher.config.settings import Config
from publisher.delivery.hub import Routes, Subscriber
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.servers import RedisServer
from tests.wsclient import Feed, refused, register

W = Watch.of

# --- the hub's index -----------------------------------------------------------------------


def _connection(*kinds: ChangeKind) -> Subscriber:
    registration = Registration("i", "s", kinds, 2 if len(kinds) > 1 else 1)
    return Subscriber(registration, transport=None, protocol=None, remote="test")  # type: ignore[arg-type]


def test_routes_find_exactly_the_connections_whose_kind_and_watch_match() -> None:
    connections = [
        _connection(ChangeKind("vm", ("nic",))),
        _connection(ChangeKind("vm", ("*",))),
        _connection(ChangeKind("vm", ("nic",), W(prefixes=["servers"]))),
        _connection(ChangeKind("vm", ("alias", "state"), W(prefixes=["servers/1"]))),
        _connection(ChangeKind("vm", ("*",), W(ids=["servers/2", "x"], prefixes=["servers/2"]))),
        _connection(ChangeKind("vm", ("nic",), W(ids=["x"])), ChangeKind("network", ("*",))),
        _connection(ChangeKind("network", ("ips",), W(prefixes=["net"]))),
    ]
    routes = Routes()
    for conn in connections:
        routes.add(conn)
    ids = ["servers", "servers/1", "servers/1/nic", "servers/10", "servers/2", "serversX",
           "server", "x", "x/y", "net", "net/a", "network", "/x", "a//b"]
    subs = [("nic",), ("alias",), ("state", "nic"), ("ips",)]
    rng = random.Random(4)
    for n in range(2000):
        entry = LogEntry(StreamId(n, 0), rng.choice(["vm", "network", "disk"]),
                         rng.choice(subs), rng.choice(ids))
        found = list(
            routes.matching(entry.resource, entry.sub_resources, entry.changed_resource_id)
        )
        assert len(found) == len(set(found)), "each connection once"
        assert set(found) == {c for c in connections if c.wants(entry)}, entry

    for conn in connections:
        routes.remove(conn)
        routes.remove(conn)  # removing twice is harmless (the hub may)
    assert routes._by_sub == routes._by_id == routes._by_prefix == {}


# --- on a real publisher -------------------------------------------------------------------


def _kind(resource: str, subs: list[str], **watch: Any) -> dict[str, Any]:
    return {"resource": resource, "subResources": subs, **watch}


def _v1(kind: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"instance": "i-1", "service": "watcher", "changeKind": kind, **extra}


def _v2(*kinds: dict[str, Any]) -> dict[str, Any]:
    return {"instance": "i-2", "service": "watcher", "resources": list(kinds)}


CHANGES = [
    Change.put("vm", "servers", ["nic"], {"uuid": "servers"}),
    Change.put("vm", "servers/1", ["nic"], {"uuid": "servers/1"}),
    Change.put("vm", "servers/1/nic", ["alias"], {"uuid": "servers/1/nic"}),
    Change.put("vm", "servers/2", ["nic"], {"uuid": "servers/2"}),
    Change.put("vm", "serversX", ["nic"], {"uuid": "serversX"}),
    Change.put("vm", "server", ["nic"], {"uuid": "server"}),
    Change.delete("vm", "servers/1", ["nic", "state"]),
    Change.publish("vm", "x", ["state"]),
    Change.publish("network", "servers/1", ["ips"]),
    Change.put("vm", "servers/10", ["state"], {"uuid": "servers/10"}),
]

REGISTRATIONS: dict[str, tuple[dict[str, Any], str]] = {
    # name: (registration, Accept-Version)
    "servers prefix, nic": (_v1(_kind("vm", ["nic"], prefixes=["servers"])), "~1"),
    "ids, all subs": (_v1(_kind("vm", ["*"], ids=["servers/2", "x"])), "~1"),
    "servers/1 prefix + every network": (
        _v2(_kind("vm", ["*"], prefixes=["servers/1/"]), _kind("network", ["*"])),
        "~2",
    ),
    "no watch (Triton)": (_v1(_kind("vm", ["nic"])), "~1"),
}

EXPECTED = {
    "servers prefix, nic": [
        ("vm", "servers"), ("vm", "servers/1"), ("vm", "servers/2"), ("vm", "servers/1"),
    ],
    "ids, all subs": [("vm", "servers/2"), ("vm", "x")],
    "servers/1 prefix + every network": [
        ("vm", "servers/1"), ("vm", "servers/1/nic"), ("vm", "servers/1"),
        ("network", "servers/1"),
    ],
    "no watch (Triton)": [
        ("vm", "servers"), ("vm", "servers/1"), ("vm", "servers/2"), ("vm", "serversX"),
        ("vm", "server"), ("vm", "servers/1"),
    ],
}


async def _items(feed: Feed, n: int) -> list[tuple[str, str]]:
    items = await feed.take(n)
    return [(i["changeKind"]["resource"], i["changedResourceId"]) for i in items]


async def test_listeners_get_exactly_the_items_their_watches_see(publisher: Service) -> None:
    feeds = {
        name: await register(publisher.ws_url, body, version)
        for name, (body, version) in REGISTRATIONS.items()
    }
    await publisher.bucket.commit_many(CHANGES)
    for name, feed in feeds.items():
        assert await _items(feed, len(EXPECTED[name])) == EXPECTED[name], name
    for feed in feeds.values():
        assert await feed.quiet()

    async with (
        aiohttp.ClientSession(publisher.url) as http,
        http.get("/changefeeds/stats") as response,
    ):
        stats = await response.json()
    kinds = sorted(orjson.dumps(r["changeKind"]).decode() for r in stats["registrations"])
    assert kinds == sorted(
        orjson.dumps(kind).decode()
        for kind in [
            _kind("vm", ["nic"], prefixes=["servers"]),
            _kind("vm", ["*"], ids=["servers/2", "x"]),
            _kind("vm", ["*"], prefixes=["servers/1"]),  # the trailing slash is dropped
            _kind("network", ["*"]),
            _kind("vm", ["nic"]),
        ]
    )


async def test_a_watch_resumes_from_the_retained_log_filtered(
    redis_server: RedisServer, make_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    # A window of 20 items: resuming 100 items back reads from Redis, then joins the window.
    async with start_publisher(make_config(redis_server.url, limits={"window": 20})) as service:
        body = _v1(_kind("vm", ["nic"], ids=["x"], prefixes=["servers"]))
        feed = await register(service.ws_url, body)
        seen = await service.bucket.commit("vm", "servers/0", ["nic"], {"uuid": "servers/0"})
        assert (await feed.next())["cursor"] == seen
        await feed.close()

        changes = [
            Change.publish("vm", id, ["nic"])
            for n in range(25)
            for id in (f"servers/{n}", f"serversX/{n}", f"racks/{n}", "x", f"x/{n}")
        ]
        cursors = await service.bucket.commit_many(changes)
        wanted = [c for c, ch in zip(cursors, changes, strict=True)
                  if ch.changed_resource_id.startswith("servers/") or ch.changed_resource_id == "x"]
        assert len(wanted) == 50

        resumed = await register(service.ws_url, {**body, "since": seen})
        assert resumed.reply["resumed"] is True
        assert [i["cursor"] for i in await resumed.take(50)] == wanted
        assert await resumed.quiet()
        live = await service.bucket.commit_many(
            [Change.publish("vm", "racks/9", ["nic"]), Change.publish("vm", "servers", ["nic"])]
        )
        assert [i["cursor"] for i in await resumed.take(1)] == live[1:]


@pytest.mark.parametrize(
    ("kind", "version", "reason"),
    [
        (_kind("vm", ["nic"], ids="servers/1"), "~1", "changeKind.ids must be a list of strings"),
        (_kind("vm", ["nic"], ids=[""]), "~1", "changeKind.ids must hold non-empty strings"),
        (_kind("vm", ["nic"], prefixes=[7]), "~1", "changeKind.prefixes must hold non-empty"),
        (_kind("vm", ["nic"], prefixes=["/"]), "~2",
         "resources[0].prefixes must not hold an empty prefix ('/')"),
    ],
)
async def test_bad_watches_are_refused_with_1008_naming_the_field(
    publisher: Service, kind: dict[str, Any], version: str, reason: str
) -> None:
    body = _v1(kind) if version == "~1" else _v2(kind)
    code, text = await refused(publisher.ws_url, orjson.dumps(body).decode(), version)
    assert code == 1008 and text.startswith(reason), text
