"""The listener against a real publisher on a real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest

from listener import (
    Backoff,
    BootstrapRecords,
    BootstrapStart,
    BufferConfig,
    BufferOverflow,
    FetchFailed,
    Listener,
    ListenerConfig,
    Phase,
    RegistrationRejected,
    Watch,
)
from publisher.bucket import Change
from publisher.server.service import Service
from tests.listener.app import View, WatchedBuffer, consuming, store_objects, vm
from tests.records import logged
from tests.servers import RedisServer, eventually, scaled

FAST = ListenerConfig(backoff=Backoff(initial=0.02, maximum=0.2), page_size=100,
                      ping_interval=1, ping_timeout=2)






async def test_bootstrap_under_concurrent_commits_gives_the_exact_view(
    publisher: Service,
) -> None:
    bucket = publisher.bucket
    await bucket.commit_many(
        [Change.put("vm", f"vm-{i:05}", ["nic"], vm(f"vm-{i:05}", n=0)) for i in range(3000)]
    )
    await bucket.commit("network", "net-1", ["ips"], vm("net-1"))
    feed = Listener(publisher.url, instance="i-1", service="tcns",
                    resources={"vm": ["nic", "alias"]}, config=FAST)
    view = View(feed)
    rng = random.Random(5)
    async with consuming(view):
        async with view._updated:  # the first page is on its way: start writing meanwhile
            await view._updated.wait_for(lambda: view.counts["BootstrapRecords"] > 0)
        for n in range(1, 301):
            id = f"vm-{rng.randrange(3500):05}"
            if n % 7 == 0:
                await bucket.commit("vm", id, ["alias"], None, delete=True)
            else:
                await bucket.commit("vm", id, [rng.choice(["nic", "alias"])], vm(id, n=n))
            await bucket.commit("network", "net-1", ["ips"], vm("net-1", n=n))
            await bucket.commit("vm", "vm-00000", ["state"], vm("vm-00000", n=-n))
        last = await bucket.commit("vm", "vm-final", ["nic"], vm("vm-final"))
        await view.wait_for(lambda: view.cursor == last)
    expected = await store_objects(bucket, "vm")
    # vm-00000's "state" changes were not listened for: the view may hold an older copy.
    view.objects["vm"].pop("vm-00000")
    expected.pop("vm-00000")
    assert view.objects == {"vm": expected}
    assert view.counts["BootstrapStart"] == 1 and view.counts["Resync"] == 0
    assert all(item.resource == "vm" and "state" not in item.sub_resources
               for item in view.changes)


async def test_buffer_overflow_during_bootstrap_aborts_and_bootstraps_again(
    publisher: Service,
) -> None:
    bucket = publisher.bucket
    await bucket.commit_many(
        [Change.put("vm", f"vm-{i:04}", ["nic"], vm(f"vm-{i:04}")) for i in range(500)]
    )
    buffer = WatchedBuffer(limit=5)
    config = ListenerConfig(buffer=BufferConfig(size=5), backoff=FAST.backoff, page_size=50)
    feed = Listener(publisher.url, instance="i-1", service="tcns", resources={"vm": ["nic"]},
                    config=config, buffer=buffer)
    view = View(feed)
    errors: list[BaseException] = []

    async def on_bootstrap(event: object) -> None:
        await view.apply(event)  # type: ignore[arg-type]
        if isinstance(event, BootstrapRecords) and view.counts["BootstrapRecords"] == 1:
            for n in range(20):  # more than the buffer holds, while the bootstrap goes on
                await bucket.commit("vm", f"new-{n}", ["nic"], vm(f"new-{n}"))
            await buffer.overflowed.wait()

    with logged() as logs:
        task = asyncio.create_task(
            feed.run(on_bootstrap=on_bootstrap, on_change=view.apply, on_error=errors.append)
        )
        try:
            await view.wait_for(lambda: view.counts["BootstrapDone"] == 1)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await feed.aclose()
    assert [type(error) for error in errors] == [BufferOverflow]
    assert view.objects == {"vm": await store_objects(bucket, "vm")}
    assert len(view.objects["vm"]) == 520
    assert view.counts["BootstrapStart"] == 2 and view.counts["Resync"] == 0
    backoffs = [entry for entry in logs if entry["event"] == "connection failed; backing off"]
    assert [entry["error_type"] for entry in backoffs] == ["BufferOverflow"]
    assert backoffs[0]["delay"] <= 0.02
    assert len(buffer) == 0


async def test_a_slow_application_overflows_then_resumes_without_loss(
    publisher: Service,
) -> None:
    bucket = publisher.bucket
    buffer = WatchedBuffer(limit=5)
    config = ListenerConfig(buffer=BufferConfig(size=5), backoff=FAST.backoff)
    feed = Listener(publisher.url, instance="i-1", service="tcns", resources={"vm": ["nic"]},
                    config=config, buffer=buffer)
    view = View(feed)
    release = asyncio.Event()
    errors: list[BaseException] = []

    async def on_change(event: object) -> None:
        await release.wait()  # the application is busy
        await view.apply(event)  # type: ignore[arg-type]

    task = asyncio.create_task(
        feed.run(on_bootstrap=view.apply, on_change=on_change, on_error=errors.append)
    )
    try:
        await view.wait_for(lambda: view.counts["BootstrapDone"] == 1)
        cursors = [await bucket.commit("vm", f"vm-{n}", ["nic"], vm(f"vm-{n}"))
                   for n in range(50)]
        await buffer.overflowed.wait()
        release.set()
        await view.wait_for(lambda: view.cursor == cursors[-1])
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await feed.aclose()
    assert [item.cursor for item in view.changes] == cursors  # each once, in order
    # Each overflow delivers what was buffered, then resumes after it: progress every time.
    assert errors and all(isinstance(error, BufferOverflow) for error in errors)
    assert view.counts["BootstrapStart"] == 1  # resumed after the overflow: no bootstrap


async def test_the_redis_buffer(publisher: Service, redis_server: RedisServer) -> None:
    config = ListenerConfig(
        buffer=BufferConfig(kind="redis", size=100, redis_url=redis_server.url, key="buf"),
        backoff=FAST.backoff,
    )
    feed = Listener(publisher.url, instance="i-1", service="tcns",
                    resources={"vm": ["*"], "network": ["name"]}, config=config)
    view = View(feed)
    async with consuming(view):
        await view.wait_for(lambda: view.counts["BootstrapDone"] == 2)
        await publisher.bucket.commit("vm", "vm-1", ["state"], vm("vm-1"))
        await publisher.bucket.commit("network", "net-1", ["ips"], vm("net-1"))
        last = await publisher.bucket.commit("network", "net-2", ["name"], vm("net-2"))
        await view.wait_for(lambda: view.cursor == last)
        assert await publisher.bucket.redis.llen("buf") == 0
    assert view.objects == {"vm": {"vm-1": vm("vm-1")}, "network": {"net-2": vm("net-2")}}


@pytest.mark.parametrize(("resources", "reason"), [
    ({"disk": ["size"]}, "unknown resource 'disk'"),
    ({"vm": ["size"]}, "unknown sub-resource 'size'"),
    ({"vm": ["nic"], "network": ["mtu"]}, "unknown sub-resource 'mtu'"),
])
async def test_a_rejected_registration_raises_with_the_reason(
    publisher: Service, resources: dict[str, list[str]], reason: str
) -> None:
    errors: list[BaseException] = []
    async with Listener(publisher.url, instance="i-1", service="tcns", resources=resources,
                        config=FAST) as feed:
        with pytest.raises(RegistrationRejected) as caught:
            await feed.run(on_error=errors.append)
    assert caught.value.close_code == 1008
    assert reason in caught.value.reason
    assert errors == []  # not retried


async def test_a_stored_cursor_the_publisher_cannot_read_means_resync_and_bootstrap(
    publisher: Service,
) -> None:
    await publisher.bucket.commit("vm", "a", ["nic"], vm("a"))
    feed = Listener(publisher.url, instance="i-1", service="tcns", resources={"vm": ["nic"]},
                    since="not-a-cursor", config=FAST)
    view = View(feed)
    async with consuming(view):
        await view.wait_for(lambda: view.counts["BootstrapDone"] == 1)
    assert view.counts["Resync"] == 1
    assert view.objects == {"vm": {"a": vm("a")}}


async def test_fetch_needs_a_registration_then_gets_objects_or_none(publisher: Service) -> None:
    await publisher.bucket.commit("vm", "a b/c", ["nic"], vm("a b/c"))
    async with Listener(publisher.url, instance="i-1", service="tcns",
                        resources={"vm": ["nic"]}, config=FAST) as feed:
        with pytest.raises(FetchFailed):
            await feed.fetch("vm", "a b/c")
        assert feed.phase is Phase.IDLE
        assert isinstance(await anext(aiter(feed)), BootstrapStart)
        assert await feed.fetch("vm", "a b/c") == vm("a b/c")
        assert await feed.fetch("vm", "absent") is None
        # mypy keeps the narrowing of the first assert across the awaits that change the phase
        assert feed.phase is Phase.BOOTSTRAPPING  # type: ignore[comparison-overlap]


async def test_a_watch_bootstraps_and_streams_only_its_objects_and_resumes(
    publisher: Service,
) -> None:
    bucket = publisher.bucket
    ids = ["servers", "serversX", "server", "x", "x/1",
           *(f"servers/{n:03}" for n in range(250)), *(f"other/{n:03}" for n in range(250))]
    await bucket.commit_many([Change.put("vm", id, ["nic"], vm(id)) for id in ids])
    watch = Watch.of(ids=["x"], prefixes=["servers"])
    wanted = {id: vm(id) for id in ids if id == "x" or id.split("/")[0] == "servers"}
    assert len(wanted) == 252

    feed = Listener(publisher.url, instance="i-1", service="watcher", resources={"vm": ["nic"]},
                    watches={"vm": watch}, config=FAST)
    view = View(feed)
    async with consuming(view):
        await view.wait_for(lambda: view.counts["BootstrapDone"] == 1)
        assert view.objects == {"vm": wanted}
        assert view.counts["BootstrapRecords"] >= 3, "paged (page_size 100)"
        changes = [Change.put("vm", id, ["nic"], vm(id, n=1))
                   for id in ("other/001", "servers/007", "serversX", "x/1", "x", "servers/new")]
        cursors = await bucket.commit_many(changes)
        await view.wait_for(lambda: view.cursor == cursors[-1])
    assert [item.changed_resource_id for item in view.changes] == [
        "servers/007", "x", "servers/new"
    ]

    # Resumed: the missed items come from the publisher's log, filtered by the watch.
    missed = await bucket.commit_many([Change.put("vm", id, ["nic"], vm(id, n=2))
                                       for id in ("other/002", "servers", "x/1", "servers/9/9")])
    again = Listener(publisher.url, instance="i-1", service="watcher",
                     resources={"vm": ["nic"]}, watches={"vm": watch},
                     since=view.cursor, config=FAST)
    resumed = View(again)
    async with consuming(resumed):
        await resumed.wait_for(lambda: resumed.cursor == missed[-1])
    assert [item.changed_resource_id for item in resumed.changes] == ["servers", "servers/9/9"]
    assert resumed.counts["BootstrapStart"] == 0 and resumed.counts["Resync"] == 0


async def test_aclose_from_another_task_ends_a_waiting_iteration(publisher: Service) -> None:
    """`async for` waits for the next change while a shutdown handler, in another task, closes
    the listener: the loop ends, rather than "asynchronous generator is already running"."""
    feed = Listener(publisher.url, instance="i-1", service="tcns", resources={"vm": ["nic"]},
                    config=FAST)
    events: list[object] = []

    async def consume() -> str:
        async for event in feed:
            events.append(event)
        return "ended"

    task = asyncio.create_task(consume())
    await eventually(lambda: feed.phase is Phase.STREAMING and feed._reader is not None,
                     "the loop waits inside __anext__ for a change")
    await asyncio.wait_for(feed.aclose(), scaled(10))
    assert await asyncio.wait_for(task, scaled(10)) == "ended"
    assert feed.phase is Phase.STREAMING
    assert [event async for event in feed] == []  # closed: nothing more


async def test_a_cancelled_iteration_still_raises_cancelled(publisher: Service) -> None:
    feed = Listener(publisher.url, instance="i-1", service="tcns", resources={"vm": ["nic"]},
                    config=FAST)

    async def consume() -> None:
        async for _ in feed:
            pass

    task = asyncio.create_task(consume())
    await eventually(lambda: feed.phase is Phase.STREAMING, "the listener streams")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await feed.aclose()
