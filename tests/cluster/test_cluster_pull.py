"""Pulling from a bucket in a real 3-master Redis Cluster: `events` with composite cursors (the
pull consumer), its refusals, and the feed's per-partition cursors."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import orjson

from changefeed.cursor import CompositeCursor, Cursor
from listener import ChangeItem, PullConsumer
from publisher.bucket import partition_of
from publisher.config.settings import Config
from tests.cluster.test_cluster_fanout import PARTITIONS, cluster_config, commit
from tests.conftest import PublisherFactory
from tests.servers import RedisCluster


async def test_the_pull_consumer_follows_a_cluster_bucket(
    redis_cluster: RedisCluster, bucket_name: str, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = cluster_config(make_config, redis_cluster, bucket_name)
    async with start_publisher(config) as service:
        committed = await commit(service, "e", 30)
        async with PullConsumer(service.url, resource="vm") as consumer:
            first = await consumer.fetch(12, expires=5)
            assert len(first) == 12
            saved = consumer.cursor
            assert saved is not None and CompositeCursor.decode(saved).epoch == service.hub.epoch
        rest: list[ChangeItem] = []
        async with PullConsumer(service.url, resource="vm", after=saved) as resumed:
            while len(rest) < 18:
                rest += await resumed.fetch(100, expires=5)
        got = [i.changed_resource_id for i in [*first, *rest]]
        assert sorted(got) == sorted(committed), "each item once, none missing"
        for p in range(PARTITIONS):
            of_p = [i for i in got if partition_of(i, PARTITIONS) == p]
            assert of_p == sorted(of_p, key=lambda i: int(i.split("-")[1]))

        async with aiohttp.ClientSession() as http:
            url = service.url + "/changefeeds/events"
            async with http.get(url, params={"order": "oldest", "before": saved}) as r:
                assert r.status == 400 and "oldest first" in (await r.json())["message"]
            old = CompositeCursor.decode(saved)
            await service.bucket.trim(None, PARTITIONS)  # each partition keeps one item
            params = {"order": "oldest", "after": old.encode(), "wait_time": "1ms"}
            async with http.get(url, params=params) as r:
                reply = await r.json()
            assert r.status == 200 and reply["missed"] is True


async def test_the_feed_gives_each_partition_its_own_cursor(
    redis_cluster: RedisCluster, bucket_name: str, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = cluster_config(make_config, redis_cluster, bucket_name)
    async with start_publisher(config) as service, aiohttp.ClientSession() as http:
        committed = await commit(service, "f", 20)
        params = {"n": str(PARTITIONS), **{f"cursor{p}": "_first" for p in range(PARTITIONS)}}
        seen: list[str] = []
        checkpoints: dict[int, str] = {}
        for _ in range(10):
            moved = {f"cursor{p}": c for p, c in checkpoints.items()}
            query = {**params, "pagesizehint": "7", **moved}
            async with http.get(service.url + "/changefeeds/feed/v1", params=query) as r:
                assert r.status == 200, await r.text()
                body = await r.read()
            for line in body.splitlines():
                record = orjson.loads(line)
                if "cursor" in record:
                    checkpoints[record["partition"]] = record["cursor"]
                else:
                    id = record["data"]["changedResourceId"]
                    assert record["partition"] == partition_of(id, PARTITIONS)
                    seen.append(id)
            if len(seen) >= 20:
                break
        assert sorted(seen) == sorted(committed)
        for text in checkpoints.values():
            assert Cursor.decode(text).epoch == service.hub.epoch
        # A composite cursor stands for each partition's position in it.
        head = CompositeCursor(
            service.hub.epoch, tuple(Cursor.decode(checkpoints[p]).position
                                     for p in range(PARTITIONS))
        ).encode()
        query = {**params, **{f"cursor{p}": head for p in range(PARTITIONS)}}
        async with http.get(service.url + "/changefeeds/feed/v1", params=query) as r:
            assert r.status == 200 and not [
                line for line in (await r.read()).splitlines() if b"changedResourceId" in line
            ]
