"""Ordinary concurrency is no outage: requests wait for a free Redis connection of the bounded
pool, and only a pool that stays busy past `bucket.poolTimeout` is answered as overload (503 with
Retry-After, websocket 4029), never as Redis being down."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import aiohttp
import orjson
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from publisher.config.settings import Config
from tests.conftest import PublisherFactory
from tests.servers import RedisServer, scaled
from tests.wsclient import register, v1

CONCURRENT = 500


async def test_500_concurrent_resumes_and_pages_see_no_false_error(
    redis_server: RedisServer, make_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    config = make_config(
        redis_server.url,
        bucket={"redisUrl": redis_server.url, "name": "test", "poolSize": 4},
        server={"host": "127.0.0.1", "port": 0, "maxConnections": 4000,
                "maxConnectionsPerClient": 4000},
    )
    async with start_publisher(config) as service:
        since = await service.bucket.publish("vm", "vm-0", ["nic"])
        for i in range(20):
            await service.bucket.commit("vm", f"vm-{i}", ["nic"], {"uuid": f"vm-{i}"})

        async def resume() -> bool:
            feed = await register(service.ws_url, v1("vm", ["nic"], since=since),
                                  open_timeout=scaled(60))
            try:
                return bool(feed.reply["resumed"])
            finally:
                await feed.close()

        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=scaled(60))
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

            async def page() -> tuple[int, bytes]:
                async with http.get(service.url + "/vms?limit=5") as response:
                    return response.status, await response.read()

            results = await asyncio.gather(
                *(resume() for _ in range(CONCURRENT)), *(page() for _ in range(CONCURRENT))
            )
        resumed = results[:CONCURRENT]
        pages = cast(list[tuple[int, bytes]], results[CONCURRENT:])
        assert all(resumed), f"{resumed.count(False)} resumes refused"
        failed = [(status, body[:200]) for status, body in pages if status != 200]
        assert not failed, failed[:5]


async def test_a_pool_that_stays_busy_is_overload_not_an_outage(
    redis_server: RedisServer, make_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    config = make_config(
        redis_server.url,
        bucket={"redisUrl": redis_server.url, "name": "test", "poolSize": 1, "poolTimeout": 0.2},
    )
    async with start_publisher(config) as service:
        since = await service.bucket.publish("vm", "vm-0", ["nic"])
        pool = service.bucket.redis.connection_pool
        held = await pool.get_connection()  # type: ignore[no-untyped-call]  # the only one
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(service.url + "/vms") as response:
                    assert response.status == 503
                    assert response.headers["Retry-After"] == "1"
                    body = await response.json()
                assert body["code"] == "Overloaded" and "overloaded" in body["message"]
                rpc = {"jsonrpc": "2.0", "id": 1, "method": "events"}
                async with http.post(service.url + "/changefeeds/rpc", json=rpc) as response:
                    assert response.status == 503 and response.headers["Retry-After"] == "1"
                    error = (await response.json())["error"]
                assert error["code"] == -32000 and "overloaded" in error["message"]
            async with connect(service.ws_url, additional_headers={"Accept-Version": "~1"}) as ws:
                await ws.send(orjson.dumps(v1("vm", ["nic"], since=since)).decode())
                try:
                    await asyncio.wait_for(ws.recv(), scaled(10))
                    raise AssertionError("registration accepted while the pool was busy")
                except ConnectionClosed as closed:
                    assert closed.rcvd is not None
                    assert closed.rcvd.code == 4029 and "overloaded" in closed.rcvd.reason
        finally:
            await pool.release(held)
        async with aiohttp.ClientSession() as http, http.get(service.url + "/vms") as response:
            assert response.status == 200, "served again once a connection is free"
