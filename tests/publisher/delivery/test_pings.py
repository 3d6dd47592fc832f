"""The publisher's keepalive (publisher.delivery.pings): one sweep pings quiet listeners and closes
those that do not answer; against a real publisher and Redis, with a short `limits.pingInterval`."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest
import structlog

from publisher.config.settings import Config
from publisher.delivery.pings import Verdict, verdict
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.publisher.web.test_metrics import scrape
from tests.servers import RedisServer, eventually, scaled
from tests.wsclient import register, v1

INTERVAL = 0.4
"""`limits.pingInterval` of these tests: a sweep every 0.2 s."""


def test_a_listener_is_pinged_after_two_quiet_sweeps_and_dead_after_three() -> None:
    assert [verdict(quiet) for quiet in range(6)] == [
        Verdict.WAIT, Verdict.WAIT, Verdict.PING, Verdict.DEAD, Verdict.DEAD, Verdict.DEAD,
    ]


@pytest.fixture
async def pinging(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> AsyncIterator[Service]:
    config = make_config(redis_server.url, limits={"pingInterval": INTERVAL})
    async with start_publisher(config) as service:
        yield service


async def _connect(
    http: aiohttp.ClientSession, service: Service
) -> aiohttp.ClientWebSocketResponse:
    """A websocket that answers no ping by itself (autoping off), not registered yet."""
    return await http.ws_connect(
        service.ws_url, autoping=False, headers={"Accept-Version": "~1"}
    )


async def _registered(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    await ws.send_str(orjson.dumps(v1("vm", ["nic"])).decode())
    message = await ws.receive(timeout=scaled(5))
    assert message.type is aiohttp.WSMsgType.TEXT, message
    reply: dict[str, Any] = orjson.loads(message.data)
    return reply


async def test_a_listener_that_answers_no_ping_is_closed_within_two_intervals(
    pinging: Service,
) -> None:
    service = pinging
    with structlog.testing.capture_logs() as logs:
        async with aiohttp.ClientSession() as http, await _connect(http, service) as ws:
            await _registered(ws)
            registered = time.monotonic()
            assert len(service.hub.connections) == 1
            pings = 0
            while True:
                message = await ws.receive(timeout=scaled(5))
                if message.type is not aiohttp.WSMsgType.PING:
                    break
                pings += 1  # and no pong
            silent = time.monotonic() - registered
        assert message.type is aiohttp.WSMsgType.CLOSE, message
        assert (message.data, message.extra) == (1001, "no pong within 0.2 s")
        assert pings == 1
        # Pinged after one to 1.5 intervals of silence, closed half an interval later.
        assert 1.25 * INTERVAL <= silent <= 2 * INTERVAL + scaled(0.5)
        await eventually(lambda: not service.hub.connections, "the listener is forgotten")
    assert service.hub.counters.closed["noPong"] == 1
    samples, _, _ = await scrape(service)
    assert samples["changefeed_no_pong_closes_total", ()] == 1
    closes = [e for e in logs if e["event"] == "listener closed: no pong"]
    assert len(closes) == 1 and closes[0]["instance"] == v1()["instance"]


async def test_listeners_that_answer_pings_stay_and_keep_receiving(pinging: Service) -> None:
    service = pinging
    # A websockets client answers pings by itself; it sends none of its own here.
    plain = await register(service.ws_url, v1("vm", ["nic"]), ping_interval=None)
    async with aiohttp.ClientSession() as http, await _connect(http, service) as ws:
        await _registered(ws)
        pings = 0
        until = time.monotonic() + 5 * INTERVAL
        while (left := until - time.monotonic()) > 0:
            try:
                message = await ws.receive(timeout=left)
            except TimeoutError:
                break
            assert message.type is aiohttp.WSMsgType.PING, message
            pings += 1
            await ws.pong(message.data)
        assert pings >= 3  # one per interval or so, each answered
        cursor = await service.bucket.commit("vm", "vm-1", ["nic"], {"uuid": "vm-1"})
        message = await ws.receive(timeout=scaled(5))
        assert message.type is aiohttp.WSMsgType.TEXT
        assert orjson.loads(message.data)["cursor"] == cursor
        assert (await plain.next())["cursor"] == cursor
        assert len(service.hub.connections) == 2
    assert service.hub.counters.closed["noPong"] == 0
    await plain.ws.close()


async def test_a_listener_that_sends_heartbeats_is_not_pinged(pinging: Service) -> None:
    service = pinging
    async with aiohttp.ClientSession() as http, await _connect(http, service) as ws:
        await _registered(ws)
        for _ in range(10):  # five intervals, a heartbeat every half interval
            await ws.send_str("heartbeat")
            with pytest.raises(TimeoutError):
                message = await ws.receive(timeout=INTERVAL / 2)
                raise AssertionError(f"sent {message}")
        assert len(service.hub.connections) == 1


async def test_a_listeners_ping_is_answered_before_and_after_registering(
    pinging: Service,
) -> None:
    service = pinging
    async with aiohttp.ClientSession() as http, await _connect(http, service) as ws:
        await ws.ping(b"before")
        message = await ws.receive(timeout=scaled(5))
        assert (message.type, message.data) == (aiohttp.WSMsgType.PONG, b"before")
        await _registered(ws)
        await ws.ping(b"after")
        while (message := await ws.receive(timeout=scaled(5))).type is aiohttp.WSMsgType.PING:
            await ws.pong(message.data)  # the publisher's own, should one come first
        assert (message.type, message.data) == (aiohttp.WSMsgType.PONG, b"after")
        assert len(service.hub.connections) == 1

