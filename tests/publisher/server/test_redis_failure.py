"""Redis failures (issue 2, §7): HTTP and websockets stay up, commits fail loudly, and once Redis
is back the tail resumes from the last position it delivered, so no committed change is skipped.

Redis runs on a fixed free TCP port with an append-only file fsynced on every write, so it can be
killed and started again on the same URL with every acknowledged commit intact.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
import redis
from websockets.exceptions import ConnectionClosed

from changefeed.errors import BucketUnavailable
from publisher.bucket import COMMIT_LUA, Change
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.publisher.bucket.commit_call import commit_arguments, cursors_of
from tests.servers import RedisServer, eventually, scaled
from tests.wsclient import refused, register, v1, v2


async def _get(url: str) -> tuple[int, Any]:
    timeout = aiohttp.ClientTimeout(total=scaled(5))
    async with aiohttp.ClientSession(timeout=timeout) as http, http.get(url) as response:
        assert response.content_type == "application/json"
        return response.status, await response.json()


def _commit_blocking(service: Service, url: str, changes: list[Change]) -> list[str]:
    """Commit with a synchronous client, without yielding to the event loop.

    The publisher runs in this test's event loop, so its tail cannot run meanwhile: these
    changes are in Redis before the tail can possibly have read them.
    """
    keys, args = commit_arguments(service.bucket, changes)
    with redis.Redis.from_url(url) as client:
        reply = client.eval(COMMIT_LUA, len(keys), *keys, *args)
    return cursors_of(bytes(reply))


async def test_redis_killed_and_restarted_mid_stream_skips_and_repeats_nothing(
    tcp_redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    redis_url = tcp_redis_server.url
    async with start_publisher(make_config(redis_url)) as service:
        bucket = service.bucket
        nic = await register(service.ws_url, v1("vm", ["nic"]))
        networks = await register(service.ws_url, v2({"network": ["*"]}), "~2")

        def run(prefix: str, n: int) -> list[Change]:
            # Two in three changes match `nic`; every third is a network change.
            return [
                Change.put("network", f"{prefix}-{i}", ["ips"], {"id": f"{prefix}-{i}"})
                if i % 3 == 2
                else Change.put("vm", f"{prefix}-{i}", ["nic"], {"id": f"{prefix}-{i}"})
                for i in range(n)
            ]

        committed: list[tuple[str, Change]] = []

        async def commit(changes: list[Change]) -> None:
            committed.extend(zip(await bucket.commit_many(changes), changes, strict=True))

        # A run streams to the listener; kill Redis while the next run is still on its way.
        await commit(run("early", 30))
        early_nic = [c for c, ch in committed if ch.resource == "vm"]
        assert [i["cursor"] for i in await nic.take(15)] == early_nic[:15]
        await commit(run("mid", 300))
        tcp_redis_server.kill()

        # --- Redis is down ---------------------------------------------------------------
        await eventually(lambda: not service.tail.healthy, "the tail notices the outage")
        with pytest.raises(BucketUnavailable):
            await bucket.commit("vm", "lost-1", ["nic"], {"lost": True})
        with pytest.raises(BucketUnavailable):
            await bucket.commit_many(run("lost-batch", 3))
        with pytest.raises(BucketUnavailable):
            await bucket.publish("vm", "lost-2", ["nic"])

        status, body = await _get(service.url + "/changefeeds")
        assert status == 200
        assert [r["resource"] for r in body["resources"]] == ["vm", "network"]
        status, body = await _get(service.url + "/changefeeds/stats")
        assert status == 200 and body["listeners"] == 2, "registered listeners stay registered"
        status, body = await _get(service.url + "/vms?limit=5")
        assert status == 503 and body["code"] == "BucketUnavailable", body
        assert "unavailable" in body["message"]
        status, body = await _get(service.url + "/vms/early-0")
        assert status == 503 and body["code"] == "BucketUnavailable", body

        code, reason = await refused(service.ws_url, '{"instance": "x", "changeKind": '
                                     '{"resource": "vm", "subResources": ["nic"]}}')
        assert code == 1013 and "unavailable" in reason, (code, reason)

        # --- Redis is back, with its append-only file ------------------------------------
        tcp_redis_server.start()
        # Committed before the tail (still waiting out its backoff) reconnects: it must read
        # them from where it stopped, not only what arrives after it reconnects.
        after_restart = run("restart", 12)
        committed += zip(_commit_blocking(service, redis_url, after_restart), after_restart,
                         strict=True)
        await commit(run("late", 30))

        expected_nic = [c for c, ch in committed if ch.resource == "vm"]
        expected_net = [c for c, ch in committed if ch.resource == "network"]
        got_nic = [i["cursor"] for i in await nic.take(len(expected_nic) - 15, timeout=15)]
        got_net = [i["cursor"] for i in await networks.take(len(expected_net), timeout=15)]
        assert got_nic == expected_nic[15:], "every committed vm change once, in order"
        assert got_net == expected_net, "every committed network change once, in order"
        assert service.tail.healthy

        # New registrations are accepted again and both old and new listeners stream on.
        fresh = await register(service.ws_url, v1("vm", ["nic"], instance="fresh"))
        assert fresh.reply["cursor"] == committed[-1][0]
        last = await bucket.commit("vm", "final", ["nic"], {})
        assert (await nic.next())["cursor"] == last
        assert (await fresh.next())["cursor"] == last
        assert await nic.quiet() and await networks.quiet(0.05)

        # The store agrees with the bucket: what was committed is there, what failed is not.
        status, body = await _get(service.url + "/vms?limit=1000")
        assert status == 200
        stored = [item.get("id") for item in body["items"]]
        vm_ids = {ch.changed_resource_id for _, ch in committed if ch.resource == "vm"}
        assert sorted(stored, key=str) == sorted(vm_ids | {None}, key=str), "final stored {}"
        for feed in (nic, networks, fresh):
            await feed.close()


async def test_commits_wait_out_a_paused_redis_and_nothing_is_lost(
    tcp_redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    """SIGSTOP: Redis accepts nothing but drops nothing. Commits wait; HTTP and already
    registered listeners stay up; after SIGCONT every commit arrives once."""
    async with start_publisher(make_config(tcp_redis_server.url)) as service:
        feed = await register(service.ws_url, v1("vm", ["nic"]))
        first = await service.bucket.commit("vm", "a", ["nic"], {})
        assert (await feed.next())["cursor"] == first

        tcp_redis_server.pause()
        try:
            pending = asyncio.create_task(
                service.bucket.commit_many(
                    Change.put("vm", f"p{i}", ["nic"], {}) for i in range(5)
                )
            )
            done, _ = await asyncio.wait({pending}, timeout=0.2)
            assert not done, "a stopped Redis cannot have answered"
            status, body = await _get(service.url + "/changefeeds")
            assert status == 200 and body["resources"]
        finally:
            tcp_redis_server.resume()
        cursors = await asyncio.wait_for(pending, scaled(5))
        assert [i["cursor"] for i in await feed.take(5)] == cursors
        assert await feed.quiet()
        await feed.close()


async def test_registrations_are_accepted_soon_after_redis_is_back(
    tcp_redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    async with start_publisher(make_config(tcp_redis_server.url)) as service:
        tcp_redis_server.kill()
        await eventually(lambda: not service.tail.healthy, "the tail notices the outage")
        tcp_redis_server.start()
        # The tail has failed once or twice, so its next retry is due within ~0.1 s.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + scaled(1.5)
        while True:
            try:
                feed = await register(service.ws_url, v1("vm", ["nic"]))
                break
            except ConnectionClosed as refusal:
                assert refusal.rcvd is not None and refusal.rcvd.code == 1013
                assert loop.time() < deadline, "still refused with 1013 after Redis is back"
                await asyncio.sleep(0.05)  # retrying as a listener would
        assert feed.reply["resumed"] is False
        await feed.close()
