"""Fleet-wide stats: publishers on one bucket see each other's listeners through Redis; one
that dies disappears within the TTL; `changefeed stats --cluster` prints them."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from publisher.config.settings import Config
from tests.conftest import PublisherFactory
from tests.servers import PublisherProcess, RedisServer, scaled, write_config
from tests.wsclient import register, v1, v2

FAST = {"interval": 0.2, "ttl": 1}


async def get(url: str) -> tuple[int, Any]:
    timeout = aiohttp.ClientTimeout(total=scaled(10))
    async with aiohttp.ClientSession(timeout=timeout) as http, http.get(url) as response:
        return response.status, await response.json()


async def cluster(url: str) -> dict[str, Any]:
    status, body = await get(url + "/changefeeds/stats?scope=cluster")
    assert status == 200
    result: dict[str, Any] = body
    return result


async def wait_for_cluster(
    url: str, predicate: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + scaled(15)
    while True:
        body = await cluster(url)
        if predicate(body):
            return body
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting until {what}: {body}")
        await asyncio.sleep(0.05)


async def test_any_publisher_answers_for_the_fleet(
    redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url, fleet=FAST)
    async with start_publisher(config) as a, start_publisher(config) as b:
        one = await register(a.ws_url, v1("vm", ["nic"]))
        two = await register(b.ws_url, v2({"network": ["ips"]}), version="~2")
        body = await wait_for_cluster(
            a.url, lambda body: body["listeners"] == 2, "both listeners are advertised"
        )
        assert body["scope"] == "cluster"
        assert sorted(p["publisher"] for p in body["publishers"]) == sorted([a.id, b.id])
        by_id = {p["publisher"]: p for p in body["publishers"]}
        assert by_id[a.id]["url"] == a.url and by_id[a.id]["listeners"] == 1
        assert 0 <= by_id[a.id]["lastSeen"] <= 1 and by_id[a.id]["ready"] is True
        assert "registrations" not in by_id[a.id]
        kinds = {(r["publisher"], r["changeKind"]["resource"]) for r in body["registrations"]}
        assert kinds == {(a.id, "vm"), (b.id, "network")}
        # The process scope keeps its RFD 5 shape: this process's listeners only.
        status, local = await get(b.url + "/changefeeds/stats")
        assert status == 200 and local["listeners"] == 1 and local["publisher"] == b.id
        assert (await get(b.url + "/changefeeds/stats?scope=galaxy"))[0] == 400
        await one.close()
        await two.close()
    # A clean stop withdraws the reports at once.
    async with start_publisher(config) as c:
        body = await wait_for_cluster(c.url, lambda body: len(body["publishers"]) >= 1, "c")
        assert [p["publisher"] for p in body["publishers"]] == [c.id]


async def test_a_publisher_that_died_disappears_within_the_ttl(
    tmp_path: Path,
    redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    path = write_config(tmp_path / "config.js", redis_server.url, fleet=FAST)
    victim = PublisherProcess(path, "--port", "0").start()
    try:
        async with start_publisher(make_config(redis_server.url, fleet=FAST)) as survivor:
            await wait_for_cluster(
                survivor.url, lambda body: len(body["publishers"]) == 2, "both advertise"
            )
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "changefeed_cli", "stats", "--cluster", survivor.url,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(process.communicate(), scaled(30))
            assert process.returncode == 0, err
            lines = out.decode().splitlines()
            assert lines[0] == "2 publisher(s), 0 listener(s)"
            assert lines[1].split() == [
                "PUBLISHER", "HOST", "URL", "LISTENERS", "READY", "BEHIND", "LAST", "SEEN"
            ]
            assert any(victim.url in line for line in lines)

            victim.kill()  # SIGKILL: no withdrawal, the report expires
            body = await wait_for_cluster(
                survivor.url, lambda body: len(body["publishers"]) == 1, "the dead one is gone"
            )
            assert [p["publisher"] for p in body["publishers"]] == [survivor.id]
    finally:
        victim.stop()
