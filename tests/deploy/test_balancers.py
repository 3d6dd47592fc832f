"""deploy/nginx.conf and deploy/haproxy.cfg in front of two real publishers on one real Redis.

A listener connected through the balancer loses its publisher to SIGKILL, reconnects through the
balancer to the other one and resumes from its cursor: every acknowledged commit arrives once, in
order, with no Resync and no second bootstrap.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web

from listener import Backoff, ConnectionLost, Listener, ListenerConfig
from publisher.config.settings import Limits, load_config
from tests.deploy.balancers import DEPLOY, Balancer
from tests.listener.app import View, bucket_of, store_objects, vm
from tests.servers import PublisherProcess, RedisServer, scaled, write_config

BALANCERS = ["nginx", "haproxy"]
FAST = ListenerConfig(backoff=Backoff(initial=0.05, maximum=0.5), open_timeout=5)


@pytest.fixture
def publishers(redis_server: RedisServer, tmp_path: Path) -> Iterator[list[PublisherProcess]]:
    config = write_config(tmp_path / "config.js", redis_server.url)
    started: list[PublisherProcess] = []
    try:
        for _ in range(2):
            started.append(PublisherProcess(config).start())
        yield started
    finally:
        for publisher in started:
            publisher.stop()


def upstream(publisher: PublisherProcess) -> str:
    return publisher.url.removeprefix("http://")


@contextlib.contextmanager
def balancer(name: str, directory: Path, publishers: list[PublisherProcess]) -> Iterator[Balancer]:
    running = Balancer(name, directory, (upstream(publishers[0]), upstream(publishers[1])))
    running.start()
    try:
        yield running
    finally:
        running.stop()


@contextlib.asynccontextmanager
async def consuming(view: View, errors: list[BaseException]) -> AsyncIterator[None]:
    task = asyncio.create_task(view.feed.run(on_bootstrap=view.apply, on_change=view.apply,
                                             on_error=errors.append))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await view.feed.aclose()


def registered_instances(publisher: PublisherProcess) -> set[str]:
    """The instances registered with this publisher, from its own /changefeeds/stats."""
    with urllib.request.urlopen(f"{publisher.url}/changefeeds/stats", timeout=scaled(5)) as reply:
        stats = orjson.loads(reply.read())
    return {registration["instance"] for registration in stats["registrations"]}


@pytest.mark.parametrize("name", BALANCERS)
async def test_listener_resumes_through_the_balancer_when_its_publisher_is_killed(
    name: str, redis_server: RedisServer, publishers: list[PublisherProcess], tmp_path: Path
) -> None:
    config = load_config(publishers[0].config)
    async with bucket_of(config) as bucket:
        for n in range(30):
            await bucket.commit("vm", f"vm-{n:02}", ["nic"], vm(f"vm-{n:02}"))
        with balancer(name, tmp_path / name, publishers) as lb:
            feed = Listener(lb.url, instance="lb-1", service="tcns", resources={"vm": ["nic"]},
                            config=FAST)
            view = View(feed)
            errors: list[BaseException] = []
            async with consuming(view, errors):
                await view.wait_for(lambda: view.counts["BootstrapDone"] == 1)
                before = [await bucket.commit("vm", f"a-{n}", ["nic"], vm(f"a-{n}"))
                          for n in range(10)]
                await view.wait_for(lambda: view.cursor == before[-1])

                holders = [p for p in publishers if "lb-1" in registered_instances(p)]
                assert len(holders) == 1, "the listener is registered with exactly one publisher"
                (victim,) = holders
                (survivor,) = [p for p in publishers if p is not victim]
                victim.kill()

                during = [await bucket.commit("vm", f"b-{n}", ["nic"], vm(f"b-{n}"))
                          for n in range(10)]
                during.append(await bucket.commit("vm", "vm-00", ["nic"], None, delete=True))
                await view.wait_for(lambda: view.cursor == during[-1])
                after = [await bucket.commit("vm", f"c-{n}", ["nic"], vm(f"c-{n}"))
                         for n in range(10)]
                await view.wait_for(lambda: view.cursor == after[-1])
                assert registered_instances(survivor) == {"lb-1"}

            assert [item.cursor for item in view.changes] == before + during + after
            assert view.counts["Resync"] == 0 and view.counts["BootstrapStart"] == 1
            assert view.objects == {"vm": await store_objects(bucket, "vm")}
            assert errors and all(isinstance(error, ConnectionLost) for error in errors), errors
            assert feed.url == lb.url


@pytest.mark.parametrize("name", BALANCERS)
def test_the_reference_config_is_valid(name: str, tmp_path: Path) -> None:
    """`nginx -t` / `haproxy -c` accept the reference file, rendered for loopback."""
    output = Balancer(name, tmp_path, ("127.0.0.1:1", "127.0.0.1:2")).check()
    assert ("syntax is ok" if name == "nginx" else "Configuration file is valid") in output


def _seconds(text: str, directive: str) -> float:
    values = re.findall(rf"^\s*{directive}\s+(\d+)s;?$", text, re.M)
    assert len(values) == 1, f"{directive}: {values}"
    return float(values[0])


@pytest.mark.parametrize(("name", "directives"), [
    ("nginx.conf", ["proxy_read_timeout", "proxy_send_timeout"]),
    ("haproxy.cfg", ["timeout client", "timeout server", "timeout tunnel"]),
])
def test_idle_timeouts_outlast_pings_and_long_polls(name: str, directives: list[str]) -> None:
    """A healthy idle websocket (pinged every pingInterval) and the longest long poll
    (maxWait) must never be cut by the balancer; both with the publisher's defaults."""
    text = (DEPLOY / name).read_text()
    limits = Limits()
    for directive in directives:
        seconds = _seconds(text, directive)
        assert seconds > 1.5 * limits.ping_interval and seconds > limits.max_wait, directive


@pytest.mark.parametrize("name", BALANCERS)
async def test_the_balancer_passes_x_forwarded_for(name: str, tmp_path: Path) -> None:
    """What reaches a publisher through the balancer names the client in X-Forwarded-For."""
    seen: list[tuple[str, str]] = []  # (User-Agent, X-Forwarded-For)

    async def record(request: web.Request) -> web.Response:
        # haproxy adds its own header line, nginx extends the last one: the same list.
        forwarded = ", ".join(request.headers.getall("X-Forwarded-For", []))
        seen.append((request.headers.get("User-Agent", ""), forwarded))
        return web.json_response([])

    async def ready(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})  # haproxy's health check

    app = web.Application()
    app.router.add_get("/changefeeds", record)
    app.router.add_get("/readyz", ready)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        upstreams = (f"127.0.0.1:{port}", f"127.0.0.1:{port}")
        lb = await asyncio.to_thread(Balancer(name, tmp_path, upstreams).start)
        try:
            async with aiohttp.ClientSession() as session, session.get(
                f"{lb.url}/changefeeds", headers={"X-Forwarded-For": "192.0.2.7"}
            ) as response:
                assert response.status == 200
        finally:
            lb.stop()
    finally:
        await runner.cleanup()
    # The readiness probe of Balancer.start (urllib) came through it too, from 127.0.0.1;
    # haproxy's own health checks carry no X-Forwarded-For.
    probes = [forwarded for agent, forwarded in seen if agent.startswith("Python-urllib")]
    assert probes and set(probes) == {"127.0.0.1"}, seen
    assert seen[-1][1] == "192.0.2.7, 127.0.0.1"
