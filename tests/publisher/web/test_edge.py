"""The publisher's one middleware (publisher.web.edge): checks, JSON errors and counting, together,
against a real publisher and Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest

from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.publisher.web.test_metrics import scrape
from tests.servers import RedisServer, eventually
from tests.wsclient import register, v1

ORIGIN = "https://dashboard.example"
REQUESTS = "changefeed_http_requests_total"


@pytest.fixture
async def service(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> AsyncIterator[Service]:
    config = make_config(redis_server.url, allowedOrigins=[ORIGIN])
    async with start_publisher(config) as started:
        yield started


def _count(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], route: str,
           status: int) -> float:
    return samples.get(
        (REQUESTS, (("method", "GET"), ("route", route), ("status", str(status)))), 0
    )


async def test_every_request_is_checked_answered_in_json_and_counted(service: Service) -> None:
    assert len(service.app.middlewares) == 1  # one coroutine frame per websocket, not three
    url = service.url
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/vms", headers={"Origin": ORIGIN}) as response:
            assert response.status == 200
            assert response.headers["Access-Control-Allow-Origin"] == ORIGIN
        # An error of the handler: JSON, with the CORS headers of the answer it replaces.
        async with http.get(url + "/nowhere", headers={"Origin": ORIGIN}) as response:
            assert response.status == 404
            assert await response.json() == {"code": "NotFound",
                                             "message": "no route GET /nowhere"}
            assert response.headers["Access-Control-Allow-Origin"] == ORIGIN
        # Refused before any handler runs.
        async with http.get(url + "/vms", headers={"Origin": "https://elsewhere.example"}) as r:
            assert r.status == 403 and (await r.json())["code"] == "OriginNotAllowed"
            assert "Access-Control-Allow-Origin" not in r.headers
        async with http.options(url + "/vms", headers={
            "Origin": ORIGIN, "Access-Control-Request-Method": "GET",
        }) as response:
            assert response.status == 204
        # An error already in JSON (bad_request) goes out as it is.
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(service.ws_url, headers={"Accept-Version": "~9"})
        assert refused.value.status == 400
    listener = await register(service.ws_url, v1("vm", ["nic"]))
    await listener.ws.close()
    # The handler returns, and is counted, in the same step as the hub forgets the listener.
    await eventually(lambda: not service.hub.connections, "the listener is gone")
    samples, _, _ = await scrape(service)
    assert _count(samples, "/vms", 200) == 1
    assert _count(samples, "unmatched", 404) == 1
    assert _count(samples, "/vms", 403) == 1
    assert _count(samples, "/changefeeds", 400) == 1
    assert _count(samples, "/changefeeds", 101) == 1
    preflights = [v for (name, labels), v in samples.items()
                  if name == REQUESTS and ("status", "204") in labels]
    assert preflights == [1]
