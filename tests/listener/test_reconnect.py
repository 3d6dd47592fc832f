"""Failures against real publishers: kills, restarts, trims, failover, dead peers, garbage."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.server import ServerConnection, serve

from changefeed.errors import ProtocolError
from listener import (
    Backoff,
    BootstrapFailed,
    Change,
    ConnectionLost,
    Listener,
    ListenerConfig,
    RetriesExhausted,
)
from listener.options import client_options
from publisher.config.settings import Config, load_config
from tests.conftest import PublisherFactory
from tests.listener.app import View, bucket_of, publisher_process, store_objects, vm
from tests.servers import RedisServer, free_port, scaled, write_config

FAST = ListenerConfig(backoff=Backoff(initial=0.02, maximum=0.2), ping_interval=0.25,
                      ping_timeout=0.5, open_timeout=2)


@contextlib.asynccontextmanager
async def consuming(view: View, errors: list[BaseException] | None = None
                    ) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(view.feed.run(
        on_bootstrap=view.apply, on_change=view.apply,
        on_error=None if errors is None else errors.append,
    ))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await view.feed.aclose()


def fixed_port_config(tmp_path: Path, redis: RedisServer) -> Path:
    return write_config(tmp_path / "config.js", redis.url,
                        server={"host": "127.0.0.1", "port": free_port()})


async def test_publisher_killed_and_restarted_resumes_without_loss_or_repeat(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    path = fixed_port_config(tmp_path, redis_server)
    async with bucket_of(load_config(path)) as bucket:
        for n in range(200):
            await bucket.commit("vm", f"vm-{n:03}", ["nic"], vm(f"vm-{n:03}"))
        async with publisher_process(path) as first:
            feed = Listener(first.url, instance="i-1", service="tcns",
                            resources={"vm": ["nic"]}, config=FAST)
            view = View(feed)
            async with consuming(view):
                await view.wait_for(lambda: view.counts["BootstrapDone"] == 1)
                before = [await bucket.commit("vm", f"a-{n}", ["nic"], vm(f"a-{n}"))
                          for n in range(10)]
                await view.wait_for(lambda: view.cursor == before[-1])
                first.kill()
                during = [await bucket.commit("vm", f"b-{n}", ["nic"], vm(f"b-{n}"))
                          for n in range(10)]
                await bucket.commit("vm", "vm-000", ["nic"], None, delete=True)
                async with publisher_process(path):
                    after = [await bucket.commit("vm", f"c-{n}", ["nic"], vm(f"c-{n}"))
                             for n in range(10)]
                    await view.wait_for(lambda: view.cursor == after[-1])
            changes = [item.cursor for item in view.changes]
            assert changes[:20] == before + during and changes[-10:] == after
            assert len(changes) == 31  # and the delete during the outage: each exactly once
            assert view.counts["BootstrapStart"] == 1 and view.counts["Resync"] == 0
            assert view.objects == {"vm": await store_objects(bucket, "vm")}


async def test_a_bucket_trimmed_past_the_cursor_resyncs_once(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url, server={"host": "127.0.0.1", "port": free_port()})
    async with bucket_of(config) as bucket:
        for n in range(50):
            await bucket.commit("vm", f"vm-{n}", ["nic"], vm(f"vm-{n}"))
        feed = Listener(f"http://127.0.0.1:{config.server.port}", instance="i-1",
                        service="tcns", resources={"vm": ["nic"]}, config=FAST)
        view = View(feed)
        async with consuming(view):
            async with start_publisher(config):
                await view.wait_for(lambda: view.counts["BootstrapDone"] == 1)
                seen = await bucket.commit("vm", "vm-1", ["nic"], None, delete=True)
                await view.wait_for(lambda: view.cursor == seen)
            # The publisher is gone; meanwhile changes happen and age out of the bucket.
            for n in range(5):
                await bucket.commit("vm", f"new-{n}", ["nic"], vm(f"new-{n}"))
            await asyncio.sleep(0.005)  # let every item become older than the 1 ms maxAge
            assert await bucket.log.trim(0.001) >= 6
            async with start_publisher(config):
                await view.wait_for(lambda: view.counts["BootstrapDone"] == 2)
        assert view.counts["Resync"] == 1 and view.counts["BootstrapStart"] == 2
        assert view.objects == {"vm": await store_objects(bucket, "vm")}
        assert "new-4" in view.objects["vm"] and "vm-1" not in view.objects["vm"]


async def test_moves_to_the_second_publisher_when_the_first_stops(
    config: Config, start_publisher: PublisherFactory
) -> None:
    async with start_publisher(config) as one, start_publisher(config) as two:
        feed = Listener([one.url, two.url], instance="i-1", service="tcns",
                        resources={"vm": ["nic"]}, config=FAST)
        view = View(feed)
        errors: list[BaseException] = []
        async with consuming(view, errors):
            await view.wait_for(lambda: view.counts["BootstrapDone"] == 1)
            first = await one.bucket.commit("vm", "a", ["nic"], vm("a"))
            await view.wait_for(lambda: view.cursor == first)
            await one.stop()  # closes its listeners with 1001
            second = await two.bucket.commit("vm", "b", ["nic"], vm("b"))
            await view.wait_for(lambda: view.cursor == second)
            assert feed.url == two.url
        assert [item.cursor for item in view.changes] == [first, second]
        assert view.counts["BootstrapStart"] == 1
        assert [(type(e), getattr(e, "close_code", None)) for e in errors] == [
            (ConnectionLost, 1001)
        ]


@pytest.mark.parametrize("pings", ["config", "arguments"])
async def test_a_silent_publisher_is_detected_by_ping_timeout(
    redis_server: RedisServer, tmp_path: Path, start_publisher: PublisherFactory, pings: str
) -> None:
    """The pings of `FAST`, or the same as every client's options over a config that does not
    ping."""
    path = write_config(tmp_path / "config.js", redis_server.url)
    config, arguments = FAST, client_options()
    if pings == "arguments":
        config = dataclasses.replace(FAST, ping_interval=None, ping_timeout=None)
        arguments = client_options(ping_interval=FAST.ping_interval,
                                   ping_timeout=FAST.ping_timeout)
    async with publisher_process(path) as frozen, start_publisher(load_config(path)) as live:
        feed = Listener([frozen.url, live.url], instance="i-1", service="tcns",
                        resources={"vm": ["nic"]}, config=config, options=arguments)
        view = View(feed)
        errors: list[BaseException] = []
        assert frozen.process is not None
        async with consuming(view, errors):
            await view.wait_for(lambda: view.counts["BootstrapDone"] == 1)
            frozen.process.send_signal(signal.SIGSTOP)
            try:
                cursor = await live.bucket.commit("vm", "a", ["nic"], vm("a"))
                await view.wait_for(lambda: view.cursor == cursor, within=10)
            finally:
                frozen.process.send_signal(signal.SIGCONT)
        assert feed.url == live.url
        assert len(errors) == 1 and isinstance(errors[0], ConnectionLost)


# --- a publisher that sends garbage --------------------------------------------------------

REPLY = {"resource": "vm", "subResources": ["nic"], "bootstrapRoute": "/vms",
         "cursor": "aaaaaaaa.000000000001a1", "resumed": False}


@contextlib.asynccontextmanager
async def bad_publisher(answers: list[Callable[[ServerConnection], Any]]
                        ) -> AsyncIterator[tuple[str, list[Any]]]:
    """A websocket server answering the n-th registration with answers[n] (the last one after)."""
    registrations: list[Any] = []

    async def handler(ws: ServerConnection) -> None:
        registrations.append(orjson.loads(await ws.recv()))
        answer = answers[min(len(registrations), len(answers)) - 1]
        await answer(ws)
        await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"http://127.0.0.1:{port}", registrations


async def test_a_publisher_sending_garbage_is_retried_not_fatal() -> None:
    answers = [
        lambda ws: ws.send("not json"),
        lambda ws: ws.send(orjson.dumps({"changeKind": {"resource": "vm",
                                                        "subResources": ["nic"]}}).decode()),
        lambda ws: ws.send(orjson.dumps(REPLY).decode()),  # then /vms is not HTTP JSON
        lambda ws: ws.close(1011, "oops"),
    ]
    config = ListenerConfig(backoff=Backoff(initial=0.01, maximum=0.01, retries=3))
    async with bad_publisher(answers) as (url, registrations):
        errors: list[BaseException] = []
        async with Listener(url, instance="i-1", service="tcns", resources={"vm": ["nic"]},
                            config=config) as feed:
            with pytest.raises(RetriesExhausted) as caught:
                async with asyncio.timeout(scaled(10)):
                    await feed.run(on_error=errors.append)
    assert [type(error) for error in errors] == [ProtocolError, ProtocolError, BootstrapFailed]
    assert isinstance(caught.value.last, ConnectionLost) and caught.value.last.close_code == 1011
    assert len(registrations) == 4


async def test_garbage_mid_stream_reconnects_and_resumes() -> None:
    resumed = {**REPLY, "resumed": True}

    async def garbage_after_reply(ws: ServerConnection) -> None:
        await ws.send(orjson.dumps(resumed).decode())
        await ws.send('{"changeKind": 5}')

    async def good_after_reply(ws: ServerConnection) -> None:
        await ws.send(orjson.dumps(resumed).decode())
        item = {"changeKind": {"resource": "vm", "subResources": ["nic"]},
                "changedResourceId": "a", "published": "1", "cursor": "aaaaaaaa.000000000002a1"}
        await ws.send(orjson.dumps(item).decode())

    async with bad_publisher([garbage_after_reply, good_after_reply]) as (url, registrations):
        errors: list[BaseException] = []
        changes: list[Change] = []
        got = asyncio.Event()

        def on_change(change: Change) -> None:
            changes.append(change)
            got.set()

        async with Listener(url, instance="i-1", service="tcns", resources={"vm": ["nic"]},
                            since="aaaaaaaa.000000000001a1", config=FAST) as feed:
            run = asyncio.create_task(feed.run(on_change=on_change, on_error=errors.append))
            async with asyncio.timeout(scaled(10)):
                await got.wait()
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
    assert [type(error) for error in errors] == [ProtocolError]
    assert [r["since"] for r in registrations] == ["aaaaaaaa.000000000001a1"] * 2
    assert [change.id for change in changes] == ["a"]
    assert feed.cursor == "aaaaaaaa.000000000002a1"
