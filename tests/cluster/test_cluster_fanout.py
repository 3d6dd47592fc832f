"""Publishers on a bucket in a real 3-master Redis Cluster: websocket fan-out with composite
cursors, resume from a composite cursor (on the same and on another publisher), bootstrap pages
merged over the partitions, what a trim and a lost partition do."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest

from changefeed.cursor import ZERO, CompositeCursor
from changefeed.errors import ConfigError
from publisher.bucket import Change, partition_of
from publisher.bucket import ChangeBucket as ClusterBucket
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.publisher.test_sse import stream
from tests.servers import RedisCluster
from tests.wsclient import register, v1

PARTITIONS = 4


def cluster_config(
    make_config: Callable[..., Config], cluster: RedisCluster, name: str, **extra: Any
) -> Config:
    return make_config(
        None, bucket={"cluster": cluster.node_urls, "name": name, "partitions": PARTITIONS},
        **extra,
    )


async def commit(service: Service, prefix: str, n: int, subs: tuple[str, ...] = ("nic",)
                 ) -> dict[str, str]:
    ids = [f"{prefix}-{i}" for i in range(n)]
    cursors = await service.bucket.commit_many(
        Change.put("vm", id, list(subs), {"uuid": id}) for id in ids
    )
    return dict(zip(ids, cursors, strict=True))


def check_order(items: list[dict[str, Any]]) -> None:
    """Each item's cursor is composite, never goes back in any partition, and moves the item's
    own partition (others too when items this listener does not want were passed between)."""
    before: CompositeCursor | None = None
    for item in items:
        cursor = CompositeCursor.decode(item["cursor"])
        if before is not None:
            assert cursor.covers(before)
            moved = [p for p in range(PARTITIONS) if cursor.positions[p] != before.positions[p]]
            assert partition_of(item["changedResourceId"], PARTITIONS) in moved
        before = cursor


async def test_fan_out_and_resume_with_composite_cursors(
    redis_cluster: RedisCluster, bucket_name: str, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = cluster_config(make_config, redis_cluster, bucket_name, limits={"window": 20})
    async with start_publisher(config) as a, start_publisher(config) as b:
        first = await register(a.ws_url, v1("vm", ["nic"]))
        assert CompositeCursor.decode(first.reply["cursor"]).positions == (ZERO,) * PARTITIONS
        committed = await commit(a, "a", 30)
        items = await first.take(30)
        assert {i["changedResourceId"] for i in items} == set(committed)
        check_order(items)
        # Each commit's cursor (its one position) is covered by the item that carried it.
        for item in items:
            mine = CompositeCursor.decode(committed[item["changedResourceId"]])
            assert CompositeCursor.decode(item["cursor"]).covers(mine)
        await first.close()

        # 200 missed (more than the window of 20: read from Redis) plus some of another
        # sub-resource the listener does not want, and more arriving while it replays.
        missed = await commit(a, "b", 200)
        await commit(a, "skip", 10, ("state",))
        later = asyncio.create_task(commit(a, "c", 40))
        since = items[-1]["cursor"]
        resumed = await register(b.ws_url, v1("vm", ["nic"], since=since))
        assert resumed.reply["resumed"] is True and resumed.reply["cursor"] == since
        got = await resumed.take(240)
        ids = [i["changedResourceId"] for i in got]
        assert sorted(ids) == sorted([*missed, *await later]), "no gap, no duplicate"
        check_order(got)
        for p in range(PARTITIONS):  # order within each partition is commit order
            of_p = [i for i in ids if partition_of(i, PARTITIONS) == p]
            assert of_p == sorted(of_p, key=lambda i: (i[0], int(i.split("-")[1])))
        assert await resumed.quiet()

        # Resuming at the head exactly: nothing replayed, then live items.
        head = await register(a.ws_url, v1("vm", ["*"], since=got[-1]["cursor"]))
        assert head.reply["resumed"] is True
        tail = await commit(a, "d", 3)
        assert {i["changedResourceId"] for i in await head.take(3)} == set(tail)

        async with aiohttp.ClientSession() as http:
            async with http.get(a.url + "/changefeeds/stats") as r:
                stats = await r.json()
            assert r.status == 200
            assert CompositeCursor.decode(stats["tail"]["position"]).covers(
                CompositeCursor.decode(got[-1]["cursor"])
            )
            sent = [s["lastCursorSent"] for s in stats["registrations"]]
            assert sent and all(c is None or c.count("~") == PARTITIONS for c in sent)

        # A single-position cursor, or one of another partition count, is not resumed.
        for foreign in ("k2v9q4xa.0192f3a4b5c6a3", CompositeCursor(b.hub.epoch, (ZERO,)).encode()):
            fresh = await register(b.ws_url, v1("vm", ["nic"], since=foreign))
            assert fresh.reply["resumed"] is False


async def test_bootstrap_pages_merge_the_partitions_by_id(
    redis_cluster: RedisCluster, bucket_name: str, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = cluster_config(make_config, redis_cluster, bucket_name)
    async with start_publisher(config) as service:
        committed = await commit(service, "p", 25)
        seen: list[str] = []
        url = f"{service.url}/vms?limit=7"
        async with aiohttp.ClientSession() as http:
            while url:
                async with http.get(url) as response:
                    page = await response.json()
                seen += [item["uuid"] for item in page["items"]]
                cursor = CompositeCursor.decode(page["cursor"])
                url = f"{service.url}{page['next']}" if page["next"] else ""
        assert seen == sorted(committed, key=lambda id: id.encode())
        for text in committed.values():
            assert cursor.covers(CompositeCursor.decode(text))


async def test_a_trimmed_cursor_is_not_resumed_and_a_lost_partition_is_a_new_epoch(
    redis_cluster: RedisCluster, bucket_name: str, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = cluster_config(make_config, redis_cluster, bucket_name)
    async with start_publisher(config) as service:
        listener = await register(service.ws_url, v1("vm", ["nic"]))
        await commit(service, "t", 12)
        items = await listener.take(12)
        old = items[0]["cursor"]
        removed = await service.bucket.trim(None, 4)  # each partition keeps 1 item
        assert removed >= 8
        stale = await register(service.ws_url, v1("vm", ["nic"], since=old))
        assert stale.reply["resumed"] is False
        kept = await register(service.ws_url, v1("vm", ["nic"], since=items[-1]["cursor"]))
        assert kept.reply["resumed"] is True

        # One partition's keys are lost (its shard came back empty): a rollback of that
        # partition, so a new bucket epoch and every listener told to bootstrap again.
        epoch = service.hub.epoch
        lost = partition_of("t-0", PARTITIONS)
        assert isinstance(service.bucket, ClusterBucket)
        part = (await service.bucket.shards())[lost]
        await part.redis.delete(part.keys.log, part.keys.epoch, part.keys.last,
                                part.keys.trimmed)
        await asyncio.wait_for(listener.ws.wait_closed(), 15)
        assert listener.ws.close_code == 4009
        assert service.hub.epoch != epoch
        again = await register(service.ws_url, v1("vm", ["nic"], since=items[-1]["cursor"]))
        assert again.reply["resumed"] is False
        assert CompositeCursor.decode(again.reply["cursor"]).epoch == service.hub.epoch




async def test_server_sent_events_carry_and_resume_composite_cursors(
    redis_cluster: RedisCluster, bucket_name: str, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = cluster_config(make_config, redis_cluster, bucket_name)
    async with start_publisher(config) as service:
        async with stream(service.url, "resource=vm&sub=nic") as feed:
            registered = await feed.next()
            assert registered.id is not None
            assert CompositeCursor.decode(registered.id).epoch == service.hub.epoch
            first = await commit(service, "s", 6)
            items = await feed.changes(6)
            assert {i["changedResourceId"] for i in items} == set(first)
            check_order(items)
        later = await commit(service, "t", 5)
        resume = {"Last-Event-ID": items[-1]["cursor"]}
        async with stream(service.url, "resource=vm&sub=nic", **resume) as feed:
            assert orjson.loads((await feed.next()).data)["resumed"] is True
            again = await feed.changes(5)
            assert {i["changedResourceId"] for i in again} == set(later)


async def test_a_resume_outrun_by_the_window_replays_again_and_loses_nothing(
    redis_cluster: RedisCluster, bucket_name: str, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = cluster_config(make_config, redis_cluster, bucket_name, limits={"window": 3})
    async with start_publisher(config) as service:
        first = await register(service.ws_url, v1("vm", ["nic"]))
        await commit(service, "x", 1)
        since = (await first.take(1))[0]["cursor"]
        await first.close()
        missed = await commit(service, "y", 300)

        async def trickle() -> list[str]:
            ids = []
            for n in range(60):  # one at a time: the window of 3 moves on during the replay
                ids += list(await commit(service, f"z{n}", 1))
            return ids

        later = asyncio.create_task(trickle())
        resumed = await register(service.ws_url, v1("vm", ["nic"], since=since))
        assert resumed.reply["resumed"] is True
        got = [i["changedResourceId"] for i in await resumed.take(360, timeout=30)]
        assert sorted(got) == sorted([*missed, *await later])
        assert await resumed.quiet()


async def test_durable_consumers_and_the_trace_say_they_need_a_single_redis(
    redis_cluster: RedisCluster, bucket_name: str, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    """Not built for a cluster bucket yet: a config asking for durable consumers is refused at
    start naming the key, and the trace route says it keeps no trace."""
    asking = cluster_config(make_config, redis_cluster, bucket_name,
                            durable={"consumers": ["billing"]})
    with pytest.raises(ConfigError) as error:
        Service(asking)
    assert error.value.key == "durable.consumers" and "Redis Cluster" in str(error.value)
    async with start_publisher(cluster_config(make_config, redis_cluster, bucket_name)) as a:
        cursors = await commit(a, "t", 1)
        url = f"{a.url}/changefeeds/trace/{next(iter(cursors.values()))}"
        async with aiohttp.ClientSession() as http, http.get(url) as response:
            assert response.status == 404
            body = await response.json()
        assert body["code"] == "TraceDisabled" and "Redis Cluster" in body["message"]
