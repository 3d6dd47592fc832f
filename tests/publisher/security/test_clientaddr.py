"""The client's address behind trusted proxies: pure rules, then a real websocket through a
header that only a trusted peer may set."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from structlog.testing import capture_logs
from websockets.asyncio.client import connect

from publisher.config.settings import Config
from publisher.security.clientaddr import Trusted, client_of
from tests.conftest import PublisherFactory
from tests.servers import RedisServer
from tests.wsclient import v1

TRUSTED = (ipaddress.ip_network("127.0.0.1"), ipaddress.ip_network("10.0.0.0/8"))


def test_an_untrusted_peer_is_the_client_whatever_it_sends() -> None:
    assert client_of("192.0.2.1", ["198.51.100.7"], TRUSTED) == "192.0.2.1"
    assert client_of("127.0.0.1", ["198.51.100.7"], ()) == "127.0.0.1"


def test_the_first_untrusted_address_from_the_right_is_the_client() -> None:
    # The client forged the first entry; the trusted proxies appended the rest.
    header = ["203.0.113.66, 198.51.100.7, 10.1.2.3"]
    assert client_of("127.0.0.1", header, TRUSTED) == "198.51.100.7"
    assert client_of("127.0.0.1", ["198.51.100.7", "10.1.2.3"], TRUSTED) == "198.51.100.7"


def test_a_chain_of_trusted_proxies_only_gives_its_leftmost() -> None:
    assert client_of("127.0.0.1", ["10.0.0.9, 10.0.0.8"], TRUSTED) == "10.0.0.9"
    assert client_of("127.0.0.1", [], TRUSTED) == "127.0.0.1"


def test_garbage_stops_the_walk() -> None:
    assert client_of("127.0.0.1", ["198.51.100.7, unknown"], TRUSTED) == "127.0.0.1"
    assert client_of("127.0.0.1", ["[2001:db8::1]"], TRUSTED) == "2001:db8::1"


def test_trusted_is_a_container_of_addresses() -> None:
    trusted = Trusted(TRUSTED)
    assert "10.200.0.1" in trusted and "127.0.0.1" in trusted
    assert "192.0.2.1" not in trusted and "local" not in trusted


async def test_logs_and_stats_show_the_forwarded_client_only_from_trusted_proxies(
    redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    forwarded = {"X-Forwarded-For": "198.51.100.7"}
    for trusted, expected in (([], "127.0.0.1"), (["127.0.0.0/8"], "198.51.100.7")):
        config = make_config(
            redis_server.url, server={"host": "127.0.0.1", "port": 0, "trustedProxies": trusted}
        )
        async with start_publisher(config) as service:
            ws = await connect(
                service.ws_url, additional_headers={"Accept-Version": "~1", **forwarded}
            )
            await ws.send(orjson.dumps(v1()).decode())
            await ws.recv()  # the registration reply
            async with aiohttp.ClientSession() as http, http.get(
                service.url + "/changefeeds/stats"
            ) as response:
                body: Any = await response.json()
            assert [r["remote"] for r in body["registrations"]] == [expected]
            await ws.close()


async def test_a_reload_of_trusted_proxies_reaches_every_handler(
    redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    """After a reload (SIGHUP's `Service.reload`) that trusts this peer, the websocket, SSE and
    pull handlers all name the client of its X-Forwarded-For, not the peer."""
    forwarded = {"X-Forwarded-For": "198.51.100.7"}
    server = {"host": "127.0.0.1", "port": 0}
    async with start_publisher(make_config(redis_server.url, server=server)) as service:
        trusting = make_config(
            redis_server.url, server={**server, "trustedProxies": ["127.0.0.0/8"]}
        )
        assert service.reload(trusting) == []
        ws = await connect(service.ws_url, additional_headers={"Accept-Version": "~1", **forwarded})
        await ws.send(orjson.dumps(v1()).decode())
        await ws.recv()  # the registration reply
        async with aiohttp.ClientSession() as http:
            async with http.get(
                service.url + "/changefeeds/sse?resource=vm&sub=nic", headers=forwarded
            ) as sse:
                assert sse.status == 200
                await sse.content.readline()  # the registered event has begun
                async with http.get(service.url + "/changefeeds/stats") as response:
                    body: Any = await response.json()
            with capture_logs() as logs:
                async with http.get(
                    service.url + "/changefeeds/feed/v1?n=1&cursor0=_first&cursorset=s"
                    "&consumer=stranger", headers=forwarded,
                ) as response:
                    assert response.status == 403
        await ws.close()
    assert sorted(r["remote"] for r in body["registrations"]) == ["198.51.100.7"] * 2
    refused = [e for e in logs if e["event"] == "feed request refused: unknown consumer"]
    assert [e["remote"] for e in refused] == ["198.51.100.7"]
