"""The kit's fixtures and fault helpers, used as a listener author uses them: a small listener
application (tests/kit/app.py) against the real publisher and Redis, through every fault."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from changefeed_testing import Faults, RedisServer, RunningPublisher
from publisher import Change as Put
from publisher import ChangeBucket
from tests.kit.app import QUICK, Mirror, running


def vm(id: str, **fields: Any) -> dict[str, Any]:
    return {"uuid": id, **fields}


async def test_a_listener_bootstraps_and_follows_changes(
    changefeed_redis: RedisServer, changefeed_publisher: RunningPublisher,
    changefeed_bucket: ChangeBucket,
) -> None:
    assert changefeed_publisher.redis_url == changefeed_redis.url
    assert changefeed_publisher.url.startswith("http://127.0.0.1:")
    assert [r.resource for r in changefeed_publisher.config.resources] == ["vm", "network"]
    await changefeed_bucket.commit("vm", "a", ["nic"], vm("a"))
    async with running(Mirror(changefeed_publisher.url)) as mirror:
        await mirror.until(lambda: mirror.objects == {"a": vm("a")})
        last = await changefeed_bucket.commit("vm", "b", ["alias"], vm("b", alias="web"))
        await mirror.until(lambda: mirror.cursor == last)
        assert mirror.objects == {"a": vm("a"), "b": vm("b", alias="web")}


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
async def test_restart_publisher_the_listener_resumes_without_a_bootstrap(
    changefeed_publisher: RunningPublisher, changefeed_bucket: ChangeBucket,
    changefeed_faults: Faults, kill: bool,
) -> None:
    async with running(Mirror(changefeed_publisher.url)) as mirror:
        first = await changefeed_bucket.commit("vm", "a", ["nic"], vm("a"))
        await mirror.until(lambda: mirror.cursor == first)
        url = changefeed_publisher.url
        await changefeed_faults.restart_publisher(kill=kill)
        assert changefeed_publisher.url == url, "a restarted publisher keeps its URL"
        # Changes while the listener reconnects are not lost.
        await changefeed_bucket.commit("vm", "b", ["nic"], vm("b"))
        last = await changefeed_bucket.commit("vm", "a", ["state"], vm("a", state="running"))
        await mirror.until(lambda: mirror.cursor == last)
    assert mirror.objects == {"a": vm("a", state="running"), "b": vm("b")}
    assert mirror.errors, "the listener saw its connection go"
    assert mirror.events["BootstrapStart"] == 1 and mirror.events["Resync"] == 0, mirror.events


async def test_pause_redis_registration_or_bootstrap_fails_then_the_listener_reconnects(
    changefeed_publisher: RunningPublisher, changefeed_bucket: ChangeBucket,
    changefeed_faults: Faults,
) -> None:
    await changefeed_bucket.commit("vm", "a", ["nic"], vm("a"))
    impatient = dataclasses.replace(QUICK, http_timeout=1.0, open_timeout=1.0)
    async with running(Mirror(changefeed_publisher.url, config=impatient)) as mirror:
        with changefeed_faults.redis_paused():
            commit = asyncio.create_task(changefeed_bucket.commit("vm", "b", ["nic"], vm("b")))
            # The registration (the publisher asks Redis where the stream starts) or the
            # bootstrap page waits for Redis: the listener gives up after its timeout and
            # starts again.
            await mirror.until(lambda: len(mirror.errors) >= 1)
            assert not commit.done(), "a commit waits while Redis is paused"
            assert mirror.events["BootstrapDone"] == 0, "no bootstrap completes without Redis"
        last = await commit
        await mirror.until(lambda: mirror.objects.keys() == {"a", "b"})
        await mirror.until(lambda: mirror.cursor is not None and mirror.cursor >= last)
    failures = {type(e).__name__ for e in mirror.errors}
    assert failures and failures <= {"BootstrapFailed", "ConnectionLost"}, failures
    if "BootstrapFailed" in failures:
        assert mirror.events["BootstrapStart"] >= 2, "the bootstrap was started over"


async def test_pause_redis_for_seconds_a_connected_listener_loses_nothing(
    changefeed_publisher: RunningPublisher, changefeed_bucket: ChangeBucket,
    changefeed_faults: Faults,
) -> None:
    async with running(Mirror(changefeed_publisher.url)) as mirror:
        await mirror.until(lambda: mirror.events["BootstrapDone"] == 1)
        started = time.monotonic()
        pause = asyncio.create_task(changefeed_faults.pause_redis(0.5))
        await asyncio.sleep(0)  # let the pause begin: the commit below then waits for it
        last = await changefeed_bucket.commit("vm", "c", ["nic"], vm("c"))
        assert time.monotonic() - started >= 0.4, "the commit waited for the paused Redis"
        await pause
        await mirror.until(lambda: mirror.cursor == last)
    assert mirror.objects == {"c": vm("c")} and not mirror.errors


async def test_trim_past_a_stored_cursor_the_listener_resyncs(
    changefeed_publisher: RunningPublisher, changefeed_bucket: ChangeBucket,
    changefeed_faults: Faults,
) -> None:
    async with running(Mirror(changefeed_publisher.url)) as mirror:
        saved = await changefeed_bucket.commit("vm", "a", ["nic"], vm("a"))
        await mirror.until(lambda: mirror.cursor == saved)
    with pytest.raises(ValueError, match="nothing after"):
        await changefeed_faults.trim_past(saved)

    # While the service is down, the feed moves on and the log is trimmed past its cursor.
    await changefeed_bucket.commit("vm", "a", ["nic"], None, delete=True)
    await changefeed_bucket.commit("vm", "b", ["nic"], vm("b"))
    assert await changefeed_faults.trim_past(saved) == 3
    async with running(Mirror(changefeed_publisher.url, since=saved)) as again:
        await again.until(lambda: again.events["BootstrapDone"] == 1)
    assert again.events["Resync"] == 1, "the stored cursor could not be resumed"
    assert again.objects == {"b": vm("b")}


async def test_trim_past_refuses_a_cursor_of_another_bucket(changefeed_faults: Faults) -> None:
    with pytest.raises(ValueError, match="not of this bucket"):
        await changefeed_faults.trim_past("aaaaaaaaaa.000000000001a0")


async def test_slow_socket_every_change_still_arrives(
    changefeed_publisher: RunningPublisher, changefeed_bucket: ChangeBucket,
    changefeed_faults: Faults,
) -> None:
    await changefeed_bucket.commit_many(
        Put.put("vm", f"vm-{n}", ["nic"], vm(f"vm-{n}", pad="x" * 100))
        for n in range(20)
    )
    async with changefeed_faults.slow_socket(bytes_per_second=8000) as slow:
        started = time.monotonic()
        async with running(Mirror(slow.url)) as mirror:
            await mirror.until(lambda: len(mirror.objects) == 20)
            last = ""
            for n in range(10):
                last = await changefeed_bucket.commit("vm", f"vm-{n}", ["alias"], vm(f"vm-{n}"))
            await mirror.until(lambda: mirror.cursor == last, within=60)
        took = time.monotonic() - started
    assert all(mirror.objects[f"vm-{n}"] == vm(f"vm-{n}") for n in range(10))
    assert slow.forwarded > 4000
    assert took >= slow.forwarded / 2 / 8000 * 0.5, "the bytes dripped"
    assert not mirror.errors


@pytest.mark.parametrize(
    "changefeed_settings",
    [{"resources": [{"resource": "disk", "subResources": ["size"], "bootstrapRoute": "/disks"}],
      "limits": {"pageSize": 5}, "bucket": {"name": "disks", "partitions": 2}}],
)
async def test_settings_give_the_publisher_your_resources(
    changefeed_publisher: RunningPublisher, changefeed_bucket: ChangeBucket,
) -> None:
    async with (aiohttp.ClientSession() as session,
                session.get(changefeed_publisher.url + "/changefeeds") as response):
        body = await response.json()
    assert [r["resource"] for r in body["resources"]] == ["disk"]
    assert changefeed_publisher.config.limits.page_size == 5
    assert changefeed_bucket.name == "disks" and await changefeed_bucket.log.partition_count() == 2
    cursor = await changefeed_bucket.commit("disk", "d1", ["size"], {"uuid": "d1", "size": 10})
    mirror = Mirror(changefeed_publisher.url, resource="disk", config=QUICK)
    async with running(mirror):
        await mirror.until(lambda: mirror.cursor == cursor)
    assert mirror.objects == {"d1": {"uuid": "d1", "size": 10}}


@pytest.mark.parametrize("settings", [{"server": {"port": 80}}, {"bucket": {"redisUrl": "x"}}])
def test_settings_cannot_move_the_kit_s_redis_or_port(
    settings: dict[str, Any], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="are the kit's"):
        RunningPublisher.start(tmp_path, "unix:///nowhere", settings)
