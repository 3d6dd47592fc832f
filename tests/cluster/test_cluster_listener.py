"""The Python Listener on a bucket in a real 3-master Redis Cluster: its bootstrap (pages merged
over the partitions), its changes, and read-your-writes with a commit's composite cursor."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp

from changefeed.cursor import CompositeCursor, StreamId
from listener import BootstrapRecords, Change, Listener
from publisher.config.settings import Config
from tests.cluster.test_cluster_fanout import cluster_config, commit
from tests.conftest import PublisherFactory
from tests.listener.test_client import FAST
from tests.listener.test_read_your_writes import iterating
from tests.servers import RedisCluster, scaled


async def test_a_listener_bootstraps_follows_and_waits_for_its_writes(
    redis_cluster: RedisCluster, bucket_name: str, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = cluster_config(make_config, redis_cluster, bucket_name)
    async with start_publisher(config) as service:
        stored = await commit(service, "b", 12)
        feed = Listener(service.url, instance="i-1", service="tcns", resources={"vm": ["nic"]},
                        config=FAST)
        async with iterating(feed) as got:
            await feed.wait_for(stored["b-11"], scaled(10))  # covered by the bootstrap
            records = [r for e in got if isinstance(e, BootstrapRecords) for r in e.objects]
            assert sorted(r["uuid"] for r in records) == sorted(stored)
            written = await commit(service, "c", 5)
            for cursor in written.values():
                await feed.wait_for(cursor, scaled(10))
            changes = [e for e in got if isinstance(e, Change)]
            assert {c.item.changed_resource_id for c in changes} >= set(written)
            assert feed.cursor is not None
            assert all(CompositeCursor.decode(feed.cursor).covers(CompositeCursor.decode(c))
                       for c in written.values())


async def test_bootstrap_waits_for_a_composite_min_cursor(
    redis_cluster: RedisCluster, bucket_name: str, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = cluster_config(make_config, redis_cluster, bucket_name)
    async with start_publisher(config) as service, aiohttp.ClientSession() as http:
        written = await commit(service, "m", 3)
        url = service.url + "/vms"
        for cursor in written.values():
            async with http.get(url, params={"min_cursor": cursor}) as r:
                assert r.status == 200
        mine = CompositeCursor.decode(written["m-0"])
        ahead = CompositeCursor(mine.epoch, tuple(
            StreamId(at.ms + 10**9, 0) for at in mine.positions
        )).encode()
        async with http.get(url, params={"min_cursor": ahead, "wait": "0.1"}) as r:
            assert r.status == 504
        foreign = CompositeCursor("abcdefghij", mine.positions).encode()
        async with http.get(url, params={"min_cursor": foreign}) as r:
            assert r.status == 409
        async with http.get(url, params={"min_cursor": "abcdefghij.0192f3a4b5c6a3"}) as r:
            assert r.status == 400
