"""Registration and delivery over a real websocket, against a real publisher and Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from changefeed.cursor import Position
from publisher.bucket import Change
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.servers import RedisServer, scaled
from tests.wsclient import refused, register, v1, v2


async def test_v1_and_v2_listeners_get_matching_items_only(publisher: Service) -> None:
    nic = await register(publisher.ws_url, v1("vm", ["nic"]))
    assert nic.reply["bootstrapRoute"] == "/vms" and nic.reply["resumed"] is False
    assert set(nic.reply) == {"resource", "subResources", "bootstrapRoute", "cursor", "resumed"}
    everything = await register(publisher.ws_url, v2({"vm": ["*"], "network": ["ips"]}), "~2")
    assert [r["bootstrapRoute"] for r in everything.reply["bootstrapRoutes"]] == [
        "/vms",
        "/networks",
    ]
    legacy = await register(publisher.ws_url, v1("vm", ["alias"]), version=None)

    bucket = publisher.bucket
    c1 = await bucket.commit("vm", "vm-1", ["nic"], {"uuid": "vm-1"})
    c2 = await bucket.commit("vm", "vm-2", ["state"], {"uuid": "vm-2"})
    c3 = await bucket.commit("network", "net-1", ["name"], {"uuid": "net-1"})
    c4 = await bucket.commit("network", "net-2", ["ips", "name"], {"uuid": "net-2"})
    c5 = await bucket.commit("vm", "vm-1", ["alias", "nic"], None, delete=True)

    item = await nic.next()
    assert item["changeKind"] == {"resource": "vm", "subResources": ["nic"]}
    assert item["changedResourceId"] == "vm-1" and item["cursor"] == c1
    assert "bootstrapRoute" not in item
    assert int(item["published"]) == Position.decode(c1).position.ms
    assert (await nic.next())["cursor"] == c5
    assert [i["cursor"] for i in await everything.take(4)] == [c1, c2, c4, c5]
    assert [i["cursor"] for i in await legacy.take(1)] == [c5]
    for feed in (nic, everything, legacy):
        assert await feed.quiet()
    assert c3 not in {c1, c2, c4, c5}


async def test_heartbeats_are_accepted_and_stats_count_listeners(publisher: Service) -> None:
    first = await register(publisher.ws_url, v1("vm", ["nic", "alias"]))
    second = await register(publisher.ws_url, v2({"vm": ["state"], "network": ["ips"]}), "~2")
    await first.ws.send("heartbeat")
    cursor = await publisher.bucket.commit("vm", "a", ["nic"], {})
    assert (await first.next())["cursor"] == cursor

    async with (
        aiohttp.ClientSession() as http,
        http.get(publisher.url + "/changefeeds/stats") as response,
    ):
        stats = await response.json()
    assert stats["listeners"] == 2
    assert stats["publisher"] == publisher.id
    kinds = sorted((r["instance"], r["changeKind"]["resource"]) for r in stats["registrations"])
    assert kinds == sorted(
        [
            ("de1aac97-6f85-4ba9-b51e-514f48a6a46c", "vm"),
            ("7b0a1c2d-0000-4000-8000-000000000002", "vm"),
            ("7b0a1c2d-0000-4000-8000-000000000002", "network"),
        ]
    )
    by_instance = {r["instance"]: r for r in stats["registrations"]}
    first_stats = by_instance["de1aac97-6f85-4ba9-b51e-514f48a6a46c"]
    assert first_stats["lastCursorSent"] == cursor
    assert first_stats["itemsBehindHead"] == 0
    assert first_stats["service"] == "tcns" and first_stats["publisher"] == publisher.id

    await first.close()
    await second.close()
    for _ in range(100):
        if not publisher.hub.connections:
            break
        await asyncio.sleep(0.02)
    assert not publisher.hub.connections, "registrations are dropped when their socket goes"


INVALID = [
    ("not json", "~1", 1008, "not valid JSON"),
    ("[1]", "~1", 1008, "must be a JSON object"),
    (
        '{"service": "tcns", "changeKind": {"resource": "vm", "subResources": ["nic"]}}',
        "~1",
        1008,
        "needs instance",
    ),
    (
        '{"instance": 5, "changeKind": {"resource": "vm", "subResources": ["nic"]}}',
        "~1",
        1008,
        "needs instance",
    ),
    (
        '{"instance": "i", "changeKind": {"resource": "disk", "subResources": ["nic"]}}',
        "~1",
        1008,
        "unknown resource 'disk'",
    ),
    (
        '{"instance": "i", "changeKind": {"resource": "vm", "subResources": ["cpu"]}}',
        "~1",
        1008,
        "unknown sub-resource 'cpu'",
    ),
    ('{"instance": "i", "resources": []}', "~2", 1008, "resources is empty"),
    (
        '{"instance": "i", "changeKind": {"resource": "vm", "subResources": ["nic"]},'
        ' "since": "zz"}',
        "~1",
        1008,
        "since: invalid cursor",
    ),
]


@pytest.mark.parametrize(("frame", "version", "code", "reason"), INVALID)
async def test_invalid_registration_closes_that_socket_only(
    publisher: Service, frame: str, version: str, code: int, reason: str
) -> None:
    healthy = await register(publisher.ws_url, v1("vm", ["nic"]))
    got_code, got_reason = await refused(publisher.ws_url, frame, version)
    assert got_code == code
    assert reason in got_reason
    cursor = await publisher.bucket.commit("vm", "x", ["nic"], {"ok": True})
    assert (await healthy.next())["cursor"] == cursor, "other listeners are not disturbed"


async def test_oversized_binary_and_second_registrations(publisher: Service) -> None:
    code, _ = await refused(publisher.ws_url, "x" * 70000)
    assert code == 1009
    code, reason = await refused(publisher.ws_url, b'{"instance": "i"}')
    assert (code, reason) == (1003, "registration must be a text frame")

    feed = await register(publisher.ws_url, v1())
    await feed.ws.send(orjson.dumps(v1()).decode())
    with pytest.raises(Exception) as info:
        await feed.next()
    assert getattr(info.value, "rcvd", None) is not None
    assert info.value.rcvd.code == 1008  # type: ignore[attr-defined]
    assert "one registration" in info.value.rcvd.reason  # type: ignore[attr-defined]


async def test_registration_timeout_and_bad_accept_version(
    redis_server: RedisServer, make_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    config = make_config(redis_server.url, limits={"registrationTimeout": 0.2})
    async with start_publisher(config) as service:
        async with connect(service.ws_url) as ws:
            await asyncio.wait_for(ws.wait_closed(), scaled(5))
            assert ws.close_code == 1008
            assert ws.close_reason == "no registration within 0.2 s"
        with pytest.raises(InvalidStatus) as info:
            async with connect(service.ws_url, additional_headers={"Accept-Version": "~9"}):
                pass
        assert info.value.response.status_code == 400
        assert b"unsupported Accept-Version" in info.value.response.body


async def test_shutdown_closes_listeners_with_1001(
    config: Config, start_publisher: PublisherFactory
) -> None:
    async with start_publisher(config) as service:
        feed = await register(service.ws_url, v1())
    await asyncio.wait_for(feed.ws.wait_closed(), scaled(5))
    assert feed.ws.close_code == 1001


async def test_a_fresh_registration_starts_at_the_buckets_head_even_when_the_tail_lags(
    publisher: Service,
) -> None:
    """The reply's cursor is the bucket's head as Redis has it at registration, not the tail's
    window head: the bootstrap the listener reads next already holds those changes, so they are
    not sent again as live changes, and the cursor is a true position of the log."""
    before = await register(publisher.ws_url, v1("vm", ["nic"]))
    publisher.tail.stop()  # the window stays where it is: a tail that has not read the commits
    cursors = await publisher.bucket.commit_many(
        [Change.put("vm", f"vm-{i}", ["nic"], {"n": i}) for i in range(5)]
    )
    fresh = await register(publisher.ws_url, v1("vm", ["nic"]))
    assert fresh.reply["cursor"] == cursors[-1]
    assert Position.decode(fresh.reply["cursor"]).position > publisher.hub.window.head
    assert fresh.reply["resumed"] is False
    assert Position.decode(before.reply["cursor"]).position == publisher.hub.window.head
    await fresh.close()
    await before.close()
