"""What only a bucket in a real 3-master Redis Cluster does: the refusals of what it cannot give.
Fan-out, resume, pages, SSE, trims and lost shards run on both layouts in
tests/publisher/delivery/test_layouts_fanout.py, pulls in
tests/publisher/pull/test_layouts_pull.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from changefeed.cursor import ZERO, Position, StreamId
from changefeed.errors import ConfigError
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.publisher.layouts import commit
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


async def test_durable_consumers_are_refused_at_start_naming_why(
    redis_cluster: RedisCluster, bucket_name: str, make_config: Callable[..., Config],
) -> None:
    """A durable consumer's dispatch is one atomic compare-and-set of its position with the
    read of the log: a bucket in a Redis Cluster has no slot holding both, so a config asking
    for durable consumers is refused at start, naming the key and the reason."""
    asking = cluster_config(make_config, redis_cluster, bucket_name,
                            durable={"consumers": ["billing"]})
    with pytest.raises(ConfigError) as error:
        Service(asking)
    assert error.value.key == "durable.consumers"
    assert "Redis Cluster" in str(error.value) and "compare-and-set" in str(error.value)
    assert "`ordered`" in str(error.value)


async def test_the_trace_finds_a_commits_composite_cursor(
    redis_cluster: RedisCluster, bucket_name: str, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = cluster_config(make_config, redis_cluster, bucket_name)
    async with start_publisher(config) as a, aiohttp.ClientSession() as http:
        listener = await register(a.ws_url, v1("vm", ["nic"]))
        cursors = await commit(a, "t", 5)
        items = await listener.take(5)
        for changed_id, cursor in cursors.items():
            async with http.get(f"{a.url}/changefeeds/trace/{cursor}") as response:
                body = await response.json()
            assert response.status == 200, body
            assert body["cursor"] == cursor and body["listeners"] == 1, (changed_id, body)
            assert list(body["services"]) == ["tcns"]
        # A listener's cursor (every shard's position) names no one change.
        async with http.get(f"{a.url}/changefeeds/trace/{items[-1]['cursor']}") as response:
            body = await response.json()
        wanted = Position.decode(items[-1]["cursor"])
        if sum(at != ZERO for at in wanted.positions) > 1:
            assert response.status == 400 and body["code"] == "InvalidCursor"
        # A change not read yet, and one of another epoch.
        ahead = Position.at(a.hub.epoch, PARTITIONS, 0, StreamId(2**46, 0))
        async with http.get(f"{a.url}/changefeeds/trace/{ahead}") as response:
            assert response.status == 404 and (await response.json())["code"] == "NotReadYet"
        other = Position.at("abcdefghij", PARTITIONS, 0, StreamId(1, 0))
        async with http.get(f"{a.url}/changefeeds/trace/{other}") as response:
            assert response.status == 404 and (await response.json())["code"] == "OtherEpoch"
