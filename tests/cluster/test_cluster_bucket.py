"""A bucket in a real 3-master Redis Cluster: commits split per partition, keys on several
masters, idempotency per partition, pages merged by id, trim per partition."""

from __future__ import annotations

import pytest
import redis

from changefeed.cursor import Position, StreamId
from changefeed.errors import BucketUnavailable, ChangeError, ReplicationTimeout
from changefeed.protocol import Resource
from publisher.bucket import Change, ChangeBucket, connect, open_bucket, partition_of
from tests.servers import RedisCluster

RESOURCES = [Resource("vm", ("nic", "alias"), "/vms")]


def bucket_of(cluster: RedisCluster, name: str, partitions: int = 8) -> ChangeBucket:
    return open_bucket(cluster.url, name, RESOURCES, partitions)


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
            cursor = Position.decode(text)
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
        assert page.cursor is not None and page.cursor.composite
        assert await bucket.get("vm", "vm-3") == b'{"uuid":"vm-3"}'
    finally:
        await bucket.aclose()


async def test_idempotency_is_per_partition_and_a_partial_failure_says_what_was_written(
    redis_cluster: RedisCluster, bucket_name: str
) -> None:
    bucket = bucket_of(redis_cluster, bucket_name, partitions=4)
    try:
        ids = [f"vm-{i}" for i in range(12)]
        changes = [Change.put("vm", i, ["nic"], {"n": 1}) for i in ids]
        cursors = await bucket.commit_many(changes, key="deploy-1")
        assert await bucket.commit_many(changes, key="deploy-1") == cursors, (
            "the same call again writes nothing and returns the first cursors"
        )
        # The same key for changes that differ in one partition only: that partition refuses
        # (the key named other changes there), the others answer with their first cursors.
        changed = ids[0]
        other = [Change.put("vm", i, ["nic"], {"n": 2 if i == changed else 1}) for i in ids]
        with pytest.raises(ChangeError) as raised:
            await bucket.commit_many(other, key="deploy-1")
        p = partition_of(changed, 4)
        written = sorted({partition_of(i, 4) for i in ids} - {p})
        assert f"written in partition(s) {written}" in str(raised.value)
        assert f"not written in [{p}]" in str(raised.value)
        page = await bucket.page("vm", None, 100)
        assert len(page.ids) == 12 and all(s == b'{"n":1}' for s in page.states)
        log_lengths = [await part.redis.xlen(part.keys.log) for part in await bucket.log.shards()]
        assert sum(log_lengths) == 12, "nothing was appended twice"
    finally:
        await bucket.aclose()


async def test_an_unreachable_cluster_is_bucket_unavailable(bucket_name: str) -> None:
    from tests.servers import free_port

    bucket = open_bucket(f"redis+cluster://127.0.0.1:{free_port()}/", bucket_name, RESOURCES, 2)
    try:
        with pytest.raises(BucketUnavailable):
            await bucket.commit("vm", "vm-1", ["nic"], {})
    finally:
        await bucket.aclose()


async def test_the_usual_five_lines_work_with_a_cluster_url(
    redis_cluster: RedisCluster, bucket_name: str
) -> None:
    bucket = ChangeBucket(connect(redis_cluster.url), bucket_name, RESOURCES, 4)
    try:
        assert not bucket.log.ordered
        cursor = await bucket.commit("vm", "vm-1", ["nic"], {"uuid": "vm-1"})
        assert Position.decode(cursor).epoch == await bucket.log.current_epoch()
        await bucket.fleet.advertise("p-1", b"{}", 10)  # the fleet's keys: one slot, {name}
        assert [name for name, _, _ in await bucket.fleet.publishers()] == ["p-1"]
    finally:
        await bucket.aclose()


async def test_a_commit_with_replicas_waits_on_each_written_shards_master(
    redis_cluster: RedisCluster, bucket_name: str
) -> None:
    """WAIT runs on the master of every shard the commit wrote (the session's cluster has no
    replicas: none confirms, so ReplicationTimeout says 0 of 1, the commit written all the
    same)."""
    bucket = bucket_of(redis_cluster, bucket_name, partitions=4)
    try:
        changes = [Change.put("vm", f"vm-{i}", ["nic"], {"n": i}) for i in range(12)]
        assert len({partition_of(c.changed_resource_id, 4) for c in changes}) > 1
        with pytest.raises(ReplicationTimeout) as raised:
            await bucket.commit_replicated(changes, key="r1", replicas=1, timeout=0.2)
        error = raised.value
        assert (error.replicas, error.acknowledged) == (1, 0)
        assert "written on the master" in str(error)
        assert error.cursors == await bucket.commit_many(changes, key="r1"), "written once"
        assert await bucket.wait_for_replicas(0, 0.1) == 0
        assert await bucket.get("vm", "vm-3") == b'{"n":3}'
    finally:
        await bucket.aclose()
