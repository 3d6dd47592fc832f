"""Fleet-wide stats: publishers on one bucket see each other's listeners through Redis; one
that dies disappears within the TTL; `changefeed stats --fleet` prints them. `?scope=cluster`
and `--cluster`, the first spellings, are aliases that answer the same."""

from __future__ import annotations

import asyncio
import os
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


async def fleet(url: str, scope: str = "fleet") -> dict[str, Any]:
    status, body = await get(url + f"/changefeeds/stats?scope={scope}")
    assert status == 200
    result: dict[str, Any] = body
    return result


def steady(body: dict[str, Any]) -> dict[str, Any]:
    """A fleet stats body without what moves between two reads (report times, counters)."""
    return {
        "scope": body["scope"],
        "listeners": body["listeners"],
        "publisher": body["publisher"],
        "publishers": sorted(
            (p["publisher"], p["url"], p["listeners"]) for p in body["publishers"]
        ),
        "registrations": sorted(
            body["registrations"], key=lambda r: (r["publisher"], r["instance"])
        ),
    }


async def wait_for_fleet(
    url: str, predicate: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + scaled(15)
    while True:
        body = await fleet(url)
        if predicate(body):
            return body
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting until {what}: {body}")
        await asyncio.sleep(0.05)


async def stats_command(*args: str, env: dict[str, str] | None = None) -> list[str]:
    """The lines `changefeed stats ARGS` prints (it must exit 0), with `env` added to ours."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "changefeed_cli", "stats", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await asyncio.wait_for(process.communicate(), scaled(30))
    assert process.returncode == 0, err
    return out.decode().splitlines()


async def test_any_publisher_answers_for_the_fleet(
    redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url, fleet=FAST)
    async with start_publisher(config) as a, start_publisher(config) as b:
        one = await register(a.ws_url, v1("vm", ["nic"]))
        two = await register(b.ws_url, v2({"network": ["ips"]}), version="~2")
        body = await wait_for_fleet(
            a.url, lambda body: body["listeners"] == 2, "both listeners are advertised"
        )
        # The reply's `scope` keeps its first value, for the clients that read it.
        assert body["scope"] == "cluster"
        # `?scope=cluster` is an alias: the same answer as `?scope=fleet`.
        assert steady(await fleet(a.url, "cluster")) == steady(await fleet(a.url, "fleet"))
        assert steady(await fleet(b.url, "cluster")) == steady(await fleet(b.url))
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
        status, refused = await get(b.url + "/changefeeds/stats?scope=galaxy")
        assert status == 400 and refused["code"] == "InvalidScope"
        assert "'fleet'" in refused["message"] and "'cluster' is its alias" in refused["message"]
        await one.close()
        await two.close()
    # A clean stop withdraws the reports at once.
    async with start_publisher(config) as c:
        body = await wait_for_fleet(c.url, lambda body: len(body["publishers"]) >= 1, "c")
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
            await wait_for_fleet(
                survivor.url, lambda body: len(body["publishers"]) == 2, "both advertise"
            )
            lines = await stats_command("--fleet", survivor.url)
            assert lines[0] == "2 publisher(s), 0 listener(s)"
            assert lines[1].split() == [
                "PUBLISHER", "HOST", "URL", "LISTENERS", "READY", "BEHIND", "LAST", "SEEN"
            ]
            assert any(victim.url in line for line in lines)
            # `--cluster` is an alias: the same tables, but for the seconds since each report.
            alias = await stats_command("--cluster", survivor.url)
            assert [line.split()[:6] for line in alias] == [line.split()[:6] for line in lines]
            # And so are their environment variables.
            for variable in ("CHANGEFEED_STATS_FLEET", "CHANGEFEED_STATS_CLUSTER"):
                by_env = await stats_command(survivor.url, env={variable: "1"})
                assert [line.split()[:6] for line in by_env] == [
                    line.split()[:6] for line in lines
                ], variable

            victim.kill()  # SIGKILL: no withdrawal, the report expires
            body = await wait_for_fleet(
                survivor.url, lambda body: len(body["publishers"]) == 1, "the dead one is gone"
            )
            assert [p["publisher"] for p in body["publishers"]] == [survivor.id]
    finally:
        victim.stop()
