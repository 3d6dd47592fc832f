"""The `events` long-poll (ADR-075) against a real publisher and Redis, one and four partitions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from changefeed.cursor import Position, new_epoch
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.servers import RedisServer, eventually, scaled

ITEMS = [
    ("vm", "servers/1", ["nic"]),  # 0
    ("vm", "serversX", ["nic"]),  # 1
    ("network", "n1", ["ips"]),  # 2
    ("vm", "servers/2", ["alias"]),  # 3
    ("vm", "servers", ["nic"]),  # 4
    ("vm", "a", ["state"]),  # 5
    ("network", "n2", ["name"]),  # 6
    ("vm", "servers/1/nic", ["nic"]),  # 7
]


class Feed:
    """The publisher, the cursors of ITEMS and an HTTP client."""

    def __init__(self, service: Service, cursors: list[str], http: aiohttp.ClientSession) -> None:
        self.service = service
        self.cursors = cursors
        self.http = http

    async def get(self, **params: Any) -> dict[str, Any]:
        url = self.service.url + "/changefeeds/events"
        async with self.http.get(url, params=_query(params)) as r:
            body: dict[str, Any] = await r.json()
            assert r.status == 200, body
            return body

    async def rpc(self, body: Any) -> tuple[int, Any]:
        async with self.http.post(self.service.url + "/changefeeds/rpc", json=body) as r:
            return r.status, (await r.json() if r.status != 204 else None)

    def indices(self, reply: dict[str, Any]) -> list[int]:
        return [self.cursors.index(item["cursor"]) for item in reply["items"]]


def _query(params: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for key, value in params.items():
        for one in value if isinstance(value, list) else [value]:
            out.append((key, str(one)))
    return out


@pytest.fixture(params=[1, 4], ids=["1-partition", "4-partitions"])
async def feed(
    request: pytest.FixtureRequest,
    redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> AsyncIterator[Feed]:
    bucket = {"redisUrl": redis_server.url, "name": "test", "partitions": request.param}
    async with start_publisher(make_config(redis_server.url, bucket=bucket)) as service:
        cursors = []
        for resource, id, subs in ITEMS:  # one commit each: items of every partition interleave
            cursors.append(await service.bucket.publish(resource, id, subs))
        async with aiohttp.ClientSession() as http:
            yield Feed(service, cursors, http)


def C(i: int) -> Any:
    return lambda cursors: cursors[i]


# (query parameters, expected ITEMS indices newest first, expected `more`)
CASES: list[tuple[dict[str, Any], list[int], bool]] = [
    ({}, [7, 6, 5, 4, 3, 2, 1, 0], False),
    ({"max_results": 3}, [7, 6, 5], True),
    ({"max_results": 8}, [7, 6, 5, 4, 3, 2, 1, 0], False),
    ({"max_results": 0}, [7, 6, 5, 4, 3, 2, 1, 0], False),  # zero: the default number
    ({"resource": "vm"}, [7, 5, 4, 3, 1, 0], False),
    ({"resource": "vm", "sub": "nic"}, [7, 4, 1, 0], False),
    ({"resource": "vm", "sub": ["nic", "alias"], "max_results": 2}, [7, 4], True),
    ({"resource": "vm", "sub": "*"}, [7, 5, 4, 3, 1, 0], False),
    ({"prefix": "servers"}, [7, 4, 3, 0], False),
    ({"prefix": "servers/1"}, [7, 0], False),
    ({"prefix": "servers/"}, [7, 4, 3, 0], False),
    ({"id": ["a", "n1"]}, [5, 2], False),
    ({"id": "a", "prefix": "servers/2"}, [5, 3], False),
    ({"after": C(2)}, [7, 6, 5, 4, 3], False),
    ({"after": C(2), "max_results": 2}, [7, 6], True),
    ({"before": C(5)}, [4, 3, 2, 1, 0], False),
    ({"before": C(5), "after": C(1)}, [4, 3, 2], False),
    ({"before": C(5), "after": C(1), "max_results": 1}, [4], True),
    ({"before": C(0)}, [], False),
    ({"before": C(4), "resource": "network"}, [2], False),
    ({"order": "oldest"}, [0, 1, 2, 3, 4, 5, 6, 7], False),
    ({"order": "oldest", "after": C(2), "max_results": 2}, [3, 4], True),
    ({"order": "oldest", "after": C(2), "before": C(5)}, [3, 4], False),
    ({"order": "oldest", "prefix": "servers", "max_results": 3}, [0, 3, 4], True),
]


@pytest.mark.parametrize(("params", "expected", "more"), CASES)
async def test_eligible_items_newest_first(
    feed: Feed, params: dict[str, Any], expected: list[int], more: bool
) -> None:
    query = {k: v(feed.cursors) if callable(v) else v for k, v in params.items()}
    reply = await feed.get(**query)
    assert feed.indices(reply) == expected
    assert reply["more"] is more
    assert reply["oldest"] == feed.cursors[0] and reply["newest"] == feed.cursors[-1]
    assert reply["missed"] is False
    for item in reply["items"]:
        value = item["data"]["value"]
        assert item["data"]["type"] == "change"
        assert value["cursor"] == item["cursor"]
        resource, id, subs = ITEMS[feed.cursors.index(item["cursor"])]
        assert value["changeKind"] == {"resource": resource, "subResources": subs}
        assert value["changedResourceId"] == id


async def test_paging_backwards_to_the_end_then_polling_the_head(feed: Feed) -> None:
    seen: list[int] = []
    reply = await feed.get(max_results=3)
    while True:
        seen += feed.indices(reply)
        if not reply["more"]:
            break
        reply = await feed.get(max_results=3, before=reply["items"][-1]["cursor"])
    assert seen == [7, 6, 5, 4, 3, 2, 1, 0]
    # Past the end: empty, without waiting (before is set).
    assert (await feed.get(before=feed.cursors[0]))["items"] == []

    # Then poll forward from the newest item seen: a new item ends the wait at once.
    hub = feed.service.hub
    poll = asyncio.create_task(feed.get(after=feed.cursors[7], wait_time=scaled(30)))
    await eventually(lambda: hub.waiters.waiting == 1, "the poll waits on the hub")
    assert not poll.done(), "nothing new yet: the request waits"
    new = await feed.service.bucket.publish("vm", "late", ["nic"])
    reply = await asyncio.wait_for(poll, scaled(10))
    assert [item["cursor"] for item in reply["items"]] == [new]
    assert reply["newest"] == new


async def test_a_wait_ends_only_for_an_eligible_item(feed: Feed) -> None:
    hub = feed.service.hub
    poll = asyncio.create_task(
        feed.get(after=feed.cursors[7], resource="network", wait_time="30s")
    )
    await eventually(lambda: hub.waiters.waiting == 1, "the poll waits on the hub")
    waits = hub.waiters.waits
    await feed.service.bucket.publish("vm", "not-for-it", ["nic"])
    # The new item wakes the poll; it scans, finds nothing for its filter, and waits again.
    waiters = hub.waiters
    await eventually(lambda: waiters.waits == waits + 1 and waiters.waiting == 1,
                     "the poll waits again")
    assert not poll.done(), "an item the filter does not match must not end the wait"
    wanted = await feed.service.bucket.publish("network", "n3", ["ips"])
    reply = await asyncio.wait_for(poll, scaled(10))
    assert [item["cursor"] for item in reply["items"]] == [wanted]


async def test_wait_expiry_returns_empty(feed: Feed) -> None:
    started = time.monotonic()
    reply = await feed.get(after=feed.cursors[7], wait_time="300ms")
    assert reply["items"] == [] and reply["more"] is False
    assert time.monotonic() - started >= 0.29, "the request waited for new items"
    assert reply["newest"] == feed.cursors[7]


async def test_missed_items_are_reported(feed: Feed) -> None:
    await asyncio.sleep(0.05)
    new = await feed.service.bucket.publish("vm", "after-trim", ["nic"])
    await feed.service.bucket.log.trim(None, max_items=1)  # keep only the newest item
    reply = await feed.get(after=feed.cursors[0])
    assert reply["missed"] is True and "trimmed" in reply["missed_reason"]
    assert [item["cursor"] for item in reply["items"]] == [new]
    assert reply["oldest"] == reply["newest"] == new

    # After the newest trimmed item, nothing was missed.
    assert (await feed.get(after=feed.cursors[7]))["missed"] is False

    foreign = Position.single(new_epoch(), Position.decode(new).position).encode()
    reply = await feed.get(after=foreign)
    assert reply["missed"] is True and "epoch" in reply["missed_reason"]


BAD = [
    ({"max_results": "ten"}, "max_results"),
    ({"after": "nope"}, "after"),
    ({"before": "k2v9q4xa.zz"}, "before"),
    ({"wait_time": "soon"}, "wait_time"),
    ({"resource": "disk"}, "unknown resource 'disk'"),
    ({"sub": "nic"}, "needs resource"),
    ({"resource": "vm", "sub": "ips"}, "unknown sub-resource 'ips'"),
    ({"prefix": "/"}, "empty prefix"),
    ({"order": "sideways"}, "order"),
    ({"colour": "red"}, "unknown parameter(s) 'colour' (known: after, before"),
    ({"after": ["x", "y"]}, "parameter(s) 'after' may be given only once"),
]


@pytest.mark.parametrize(("params", "message"), BAD)
async def test_bad_parameters_are_400_naming_them(
    publisher: Service, params: dict[str, Any], message: str
) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.get(publisher.url + "/changefeeds/events", params=_query(params)) as response,
    ):
        body = await response.json()
    assert response.status == 400
    assert body["code"] == "InvalidParameter" and message in body["message"]


async def test_json_rpc_gives_the_same_reply(feed: Feed) -> None:
    params = {
        "filter": {"resource": "vm", "subResources": ["nic"], "prefixes": ["servers"]},
        "max_results": 2,
        "after": feed.cursors[0],
        "wait_time": 1,
    }
    status, body = await feed.rpc({"jsonrpc": "2.0", "id": 7, "method": "events", "params": params})
    assert status == 200 and body["id"] == 7
    expected = await feed.get(
        resource="vm", sub="nic", prefix="servers", max_results=2, after=feed.cursors[0]
    )
    assert body["result"] == expected
    assert feed.indices(expected) == [7, 4] and expected["more"] is False


RPC_ERRORS = [
    ("not json", 400, -32700, "parse error"),
    ([{"jsonrpc": "2.0", "id": 1, "method": "events"}], 400, -32600, "batch"),
    ({"jsonrpc": "1.0", "id": 1, "method": "events"}, 400, -32600, "jsonrpc"),
    ({"jsonrpc": "2.0", "id": 1, "method": "subscribe"}, 404, -32601, "'subscribe' not found"),
    ({"jsonrpc": "2.0", "id": 1, "method": "events", "params": [1]}, 400, -32602, "object"),
    (
        {"jsonrpc": "2.0", "id": 1, "method": "events", "params": {"filter": {"query": "x"}}},
        400,
        -32602,
        "unknown filter key(s) query",
    ),
    (
        {"jsonrpc": "2.0", "id": 1, "method": "events", "params": {"max_results": True}},
        400,
        -32602,
        "max_results",
    ),
]


@pytest.mark.parametrize(("body", "status", "code", "message"), RPC_ERRORS)
async def test_json_rpc_errors(
    publisher: Service, body: Any, status: int, code: int, message: str
) -> None:
    async with aiohttp.ClientSession() as http:
        data = body.encode() if isinstance(body, str) else None
        json = None if isinstance(body, str) else body
        async with http.post(publisher.url + "/changefeeds/rpc", data=data, json=json) as r:
            reply = await r.json()
    assert r.status == status
    assert reply["jsonrpc"] == "2.0" and reply["error"]["code"] == code
    assert message in reply["error"]["message"]


async def test_json_rpc_notification_gets_no_reply(publisher: Service) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            publisher.url + "/changefeeds/rpc",
            json={"jsonrpc": "2.0", "method": "events", "params": {"before": ""}},
        ) as r,
    ):
        assert r.status == 204


async def test_json_rpc_notification_does_not_wait(
    redis_server: RedisServer, make_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    """A notification's reply is never seen: it is answered at once, not after a long poll
    (here the default wait is a minute and nothing new is ever committed)."""
    config = make_config(redis_server.url, limits={"wait": 60, "maxWait": 60})
    async with start_publisher(config) as service:
        head = await service.bucket.publish("vm", "x", ["nic"])
        notification = {"jsonrpc": "2.0", "method": "events", "params": {"after": head}}
        timeout = aiohttp.ClientTimeout(total=scaled(10))
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.post(service.url + "/changefeeds/rpc", json=notification) as r,
        ):
            assert r.status == 204 and await r.read() == b""


async def test_redis_down_is_503_not_500(
    tcp_redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    async with start_publisher(make_config(tcp_redis_server.url)) as service:
        await service.bucket.publish("vm", "x", ["nic"])
        tcp_redis_server.kill()
        async with aiohttp.ClientSession() as http:
            async with http.get(service.url + "/changefeeds/events") as r:
                assert r.status == 503
            body = {"jsonrpc": "2.0", "id": "a", "method": "events"}
            async with http.post(service.url + "/changefeeds/rpc", json=body) as r:
                assert r.status == 503
                assert (await r.json())["error"]["code"] == -32000
            feed = {"n": "1", "cursor0": "_first"}
            async with http.get(service.url + "/changefeeds/feed/v1", params=feed) as r:
                assert r.status == 503
                assert (await r.json())["code"] == "BucketUnavailable"


async def test_shutdown_answers_waiting_long_polls(
    redis_server: RedisServer, make_config: Callable[..., Config]
) -> None:
    service = Service(make_config(redis_server.url))
    await service.start()
    stopped = False
    try:
        head = await service.bucket.publish("vm", "x", ["nic"])
        async with aiohttp.ClientSession() as http:

            async def poll() -> tuple[int, Any]:
                url = service.url + "/changefeeds/events"
                async with http.get(url, params={"after": head, "wait_time": "60s"}) as r:
                    return r.status, await r.json()

            waiting = asyncio.create_task(poll())
            await eventually(lambda: service.hub.waiters.waiting == 1, "the poll waits on the hub")
            assert not waiting.done(), "nothing new: the request waits"
            # A stop must not sit out the 60 s wait: the poll is answered, empty, at once.
            await asyncio.wait_for(service.stop(), scaled(10))
            stopped = True
            status, body = await asyncio.wait_for(waiting, scaled(5))
        assert status == 200 and body["items"] == []
    finally:
        if not stopped:
            await service.stop()


async def test_a_cursor_whose_entry_is_gone_is_told_what_it_was_given_was_rolled_back(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    """The entry at `after` gone though not trimmed (a failover to a replica that lacked it,
    before any publisher began a new epoch): the reader was given entries Redis lost. And a
    cursor of another epoch is told its position in this one when this one holds its entry."""
    async with start_publisher(make_config(redis_server.url)) as service, \
            aiohttp.ClientSession() as http:
        bucket = service.bucket
        kept = await bucket.publish("vm", "kept", ["nic"])
        lost = await bucket.publish("vm", "lost", ["nic"])
        after_loss = await bucket.publish("vm", "after", ["nic"])
        client = aioredis.from_url(redis_server.url)
        for stream in await bucket.log.streams():
            await client.xdel(stream, str(Position.decode(lost).position))

        async def get(after: str) -> dict[str, Any]:
            params = {"after": after, "wait_time": "0"}
            async with http.get(service.url + "/changefeeds/events", params=params) as r:
                assert r.status == 200
                body: dict[str, Any] = await r.json()
                return body

        reply = await get(lost)
        assert reply["missed"] is True and "rolled back" in reply["missed_reason"]
        assert {item["cursor"] for item in reply["items"]} == {kept, after_loss}  # all it has
        assert (await get(kept))["missed"] is False

        position = Position.decode(kept).position
        reply = await get(Position.single(new_epoch(), position).encode())
        assert reply["missed"] is True and reply["items"] == []
        assert reply["resume_after"] == kept
        reply = await get(Position.single(new_epoch(), Position.decode(lost).position).encode())
        assert reply["missed"] is True and "rolled back" in reply["missed_reason"]
        assert "resume_after" not in reply
        await client.aclose()
