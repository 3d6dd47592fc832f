"""A bucket in a real 3-master Redis Cluster: commits split per partition, keys on several
masters, idempotency per partition, pages merged by id, trim per partition."""

from __future__ import annotations

import redis

from changefeed.cursor import CompositeCursor, StreamId
from changefeed.protocol import Resource
from publisher.bucket import Change, partition_of
from publisher.bucket.cluster import ClusterBucket, connect_cluster
from tests.servers import RedisCluster

RESOURCES = [Resource("vm", ("nic", "alias"), "/vms")]


def bucket_of(cluster: RedisCluster, name: str, partitions: int = 8) -> ClusterBucket:
    return ClusterBucket(connect_cluster(cluster.url), name, RESOURCES, partitions)


async def test_a_commit_spreads_over_several_masters(
    redis_cluster: RedisCluster, bucket_name: str
) -> None:
    bucket = bucket_of(redis_cluster, bucket_name)
    try:
        ids = [f"vm-{i}" for i in range(40)]
        cursors = await bucket.commit_many(
            [Change.put("vm", i, ["nic"], {"uuid": i}) for i in ids]
        )
        for id, text in zip(ids, cursors, strict=True):
            cursor = CompositeCursor.decode(text)
            p = partition_of(id, 8)
            assert [n for n, at in enumerate(cursor.positions) if at != StreamId(0, 0)] == [p]
        holding = []
        for url in redis_cluster.node_urls:
            node = redis.Redis.from_url(url)
            keys = [k.decode() for k in node.scan_iter(match="{" + bucket_name + "*")]
            node.close()
            if any(":log" in k for k in keys):
                holding.append(url)
        assert len(holding) > 1, "the partitions' logs sit on more than one master"
        page = await bucket.page("vm", None, 1000)
        assert page.ids == sorted(ids)
        assert isinstance(page.cursor, CompositeCursor)
        assert await bucket.get("vm", "vm-3") == b'{"uuid":"vm-3"}'
    finally:
        await bucket.aclose()
