"""clientLimits on a real publisher: requests and registrations per second per client address
(token buckets) and the global listener cap; each refusal answered, logged once, counted, and
recovered from."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import orjson
import pytest
import structlog
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Origin

from publisher.config.settings import Config
from publisher.security.ratelimit import TokenBuckets, retry_after
from tests.conftest import PublisherFactory
from tests.servers import RedisServer, eventually, scaled
from tests.wsclient import refused, register, v1


def test_token_buckets_refill_at_their_rate() -> None:
    now = [0.0]
    buckets = TokenBuckets(2.0, 3, clock=lambda: now[0])
    assert [buckets.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("a") == 0.5  # one token in half a second
    assert buckets.take("b") == 0.0  # per key
    now[0] = 0.5
    assert buckets.take("a") == 0.0
    assert retry_after(0.01) == 1 and retry_after(1.2) == 2


def test_token_buckets_forget_full_buckets_past_their_size() -> None:
    now = [0.0]
    buckets = TokenBuckets(1.0, 1, clock=lambda: now[0], most=2)
    buckets.take("a")
    buckets.take("b")
    now[0] = 5.0
    assert buckets.take("c") == 0.0
    assert len(buckets._buckets) <= 2


async def test_requests_over_the_rate_are_429_with_retry_after_then_recover(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url,
                         clientLimits={"requestsPerSecond": 5, "requestBurst": 2})
    with structlog.testing.capture_logs() as logs:
        async with start_publisher(config) as service, aiohttp.ClientSession() as http:
            statuses = []
            for _ in range(6):
                async with http.get(service.url + "/vms") as response:
                    statuses.append(response.status)
                    if response.status == 429:
                        assert response.headers["Retry-After"] == "1"
                        body = orjson.loads(await response.read())
                        assert body["code"] == "TooManyRequests"
                        assert "clientLimits.requestsPerSecond" in body["message"]
            assert statuses[:2] == [200, 200] and statuses[-1] == 429
            await asyncio.sleep(0.25)  # one token back at 5/s
            async with http.get(service.url + "/vms") as response:
                assert response.status == 200
            counts = service.access.counts()  # what /changefeeds/stats shows as "refused"
    assert counts["TooManyRequests"] == statuses.count(429)
    lines = [e for e in logs if e["event"] == "request refused"]
    assert len(lines) == 1, "logged once per client address per interval"


async def test_registrations_over_the_rate_are_closed_with_1013_then_recover(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url, clientLimits={"registrationsPerSecond": 4,
                                                         "registrationBurst": 1})
    async with start_publisher(config) as service:
        first = await register(service.ws_url, v1())
        code, reason = await refused(service.ws_url, orjson.dumps(v1()).decode())
        assert code == 1013
        assert reason.startswith("too many registrations from 127.0.0.1")
        await asyncio.sleep(0.3)
        again = await register(service.ws_url, v1())
        assert "cursor" in again.reply
        assert service.access.counts()["tooManyRegistrations"] == 1
        await first.close()
        await again.close()


async def test_the_listener_cap_refuses_with_1013_until_one_leaves(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url, clientLimits={"maxListeners": 1})
    async with start_publisher(config) as service:
        first = await register(service.ws_url, v1())
        code, reason = await refused(service.ws_url, orjson.dumps(v1()).decode())
        assert (code, reason) == (
            1013, "publisher full: 1 listeners (clientLimits.maxListeners); try again later"
        )
        await first.close()
        await eventually(lambda: not service.hub.connections, "the first listener left")
        second = await register(service.ws_url, v1())
        assert "cursor" in second.reply
        await second.close()


async def test_a_browser_page_cannot_reach_an_open_loopback_publisher(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    """Without auth: cross-site websockets (Origin) and DNS rebinding (Host) are refused."""
    async with start_publisher(make_config(redis_server.url)) as service:
        async with aiohttp.ClientSession() as http:
            async with http.get(service.url + "/vms", headers={"Host": "evil.example"}) as r:
                assert r.status == 403
                assert (await r.json())["code"] == "HostNotAllowed"
            async with http.get(service.url + "/vms",
                                headers={"Host": "localhost:1", "Origin": "http://evil.example"}
                                ) as r:
                assert r.status == 403
                assert (await r.json())["code"] == "OriginNotAllowed"
        evil = Origin("http://evil.example")
        with pytest.raises(InvalidStatus) as refusal:
            async with connect(service.ws_url, origin=evil):
                raise AssertionError("upgraded")
        assert refusal.value.response.status_code == 403
        feed = await asyncio.wait_for(register(service.ws_url, v1()), scaled(5))
        await feed.close()
