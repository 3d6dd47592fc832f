"""What only a bucket in a real 3-master Redis Cluster does: the refusals of what it cannot give.
Fan-out, resume, pages, SSE, trims and lost shards run on both layouts in
tests/publisher/test_layouts_fanout.py, pulls in tests/publisher/test_layouts_pull.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from changefeed.errors import ConfigError
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.publisher.layouts import commit
from tests.servers import RedisCluster

PARTITIONS = 4


def cluster_config(
    make_config: Callable[..., Config], cluster: RedisCluster, name: str, **extra: Any
) -> Config:
    return make_config(
        None, bucket={"cluster": cluster.node_urls, "name": name, "partitions": PARTITIONS},
        **extra,
    )


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
