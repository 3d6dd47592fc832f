"""/healthz and /readyz against a real publisher and a real Redis that goes away."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp

from changefeed.cursor import StreamId
from publisher.config.settings import Config
from tests.conftest import PublisherFactory
from tests.servers import RedisServer, eventually, scaled


async def get(url: str) -> tuple[int, Any]:
    timeout = aiohttp.ClientTimeout(total=scaled(10))
    async with aiohttp.ClientSession(timeout=timeout) as http, http.get(url) as response:
        return response.status, await response.json()


async def test_ready_while_redis_answers_not_while_it_is_gone_alive_throughout(
    tcp_redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    async with start_publisher(make_config(tcp_redis_server.url)) as service:
        status, body = await get(service.url + "/readyz")
        assert status == 200 and body["status"] == "ok" and body["reasons"] == []
        assert body["checks"]["redis"] == "ok" and body["checks"]["tail"]["healthy"] is True
        assert (await get(service.url + "/healthz")) == (
            200, {"status": "ok", "publisher": service.id}
        )

        tcp_redis_server.kill()
        status, body = await get(service.url + "/readyz")
        assert status == 503 and body["status"] == "unavailable"
        assert body["reasons"][0].startswith("redis unreachable")
        assert (await get(service.url + "/healthz"))[0] == 200

        tcp_redis_server.start()
        await eventually(lambda: service.tail.healthy, "the tail reads again", within=20)
        assert (await get(service.url + "/readyz"))[0] == 200


async def test_not_ready_while_draining(publisher: Any) -> None:
    await publisher.drain()
    status, body = await get(publisher.url + "/readyz")
    assert status == 503 and body["checks"]["draining"] is True
    assert (await get(publisher.url + "/healthz"))[0] == 200


async def test_not_ready_when_the_tail_lags_more_than_configured(
    redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    """The lag is what the tail's last read said (`tail.unread`, `tail.heads`); set here as a
    read would, since a real lag cannot be held still long enough to look at it."""
    config = make_config(redis_server.url, health={"maxLagItems": 2, "maxLagSeconds": 5})
    async with start_publisher(config) as service:
        await service.bucket.publish("vm", "a", ["nic"])
        await eventually(lambda: service.hub.window.head.ms > 0, "the tail read the commit")
        service.tail.stop()  # it waits for more in a blocked read, abandoned now: no more reads
        head = service.hub.window.head
        service.tail.unread = 3
        service.tail.heads = (StreamId(head.ms + 1000, 0),)
        status, body = await get(service.url + "/readyz")
        assert status == 503
        assert any("3 items behind" in reason for reason in body["reasons"])
        assert body["checks"]["tail"]["itemsBehind"] == 3
        service.tail.unread = 1
        service.tail.heads = (StreamId(head.ms + 10_000, 0),)
        status, body = await get(service.url + "/readyz")
        assert status == 503 and "10.0 s behind" in " ".join(body["reasons"])
