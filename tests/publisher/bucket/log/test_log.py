"""Partitioned buckets: one id sequence over every partition, merged reads, fixed partition
count, and trimming by item count."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from changefeed.cursor import Position, StreamId
from changefeed.errors import PartitionMismatch
from publisher.bucket import ChangeBucket, LogEntry, connect, merge_partitions, partition_of
from publisher.config.settings import Config
from tests.conftest import PublisherFactory
from tests.servers import RedisServer
from tests.wsclient import register, v1


def entry(ms: int) -> LogEntry:
    return LogEntry(StreamId(ms, 0), "vm", ("nic",), str(ms))


@pytest.mark.parametrize(
    ("parts", "count", "newest_first", "expected"),
    [
        ([[1, 4], [2, 3]], 4, False, [1, 2, 3, 4]),
        ([[1, 4], [2, 3]], 3, False, [1, 2, 3]),
        # Partition 0 came back full at 2: entries after it may exist unread, so 5 must wait.
        ([[1, 2], [5]], 2, False, [1, 2]),
        ([[1, 6], [2, 3]], 2, False, [1, 2]),
        ([[3, 9], [5]], 2, False, [3, 5]),
        ([[], [7]], 2, False, [7]),
        ([[9, 8], [7]], 2, True, [9, 8]),
        ([[9, 4], [7, 6]], 2, True, [9, 7]),
        ([[9], [7, 6]], 2, True, [9, 7]),
    ],
)
def test_merge_never_passes_a_full_partition(
    parts: list[list[int]], count: int, newest_first: bool, expected: list[int]
) -> None:
    merged = merge_partitions(
        [[entry(ms) for ms in part] for part in parts], count, newest_first=newest_first
    )
    assert [e.position.ms for e in merged] == expected


def test_partition_of_is_stable() -> None:
    # Fixed values: every publisher and Spark job must put an id in the same partition.
    assert [partition_of(f"vm-{i}", 4) for i in range(8)] == [
        partition_of(f"vm-{i}", 4) for i in range(8)
    ]
    assert {partition_of(f"vm-{i}", 8) for i in range(100)} == set(range(8))
    assert partition_of("anything", 1) == 0


async def test_partitioned_log_is_pushed_in_commit_order(
    redis_server: RedisServer, make_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    bucket = {"redisUrl": redis_server.url, "name": "test", "partitions": 4}
    config = make_config(redis_server.url, bucket=bucket, limits={"window": 5})
    async with start_publisher(config) as service:
        listener = await register(service.ws_url, v1("vm", ["nic"]))
        first = await service.bucket.publish_many(("vm", f"vm-{i}", ["nic"]) for i in range(30))
        assert first == sorted(first), "one id sequence: cursors order every partition"
        assert [i["cursor"] for i in await listener.take(30)] == first
        redis = service.bucket.redis
        lengths = [await redis.xlen(f"{{test}}:log:{p}") for p in range(4)]
        assert sum(lengths) == 30 and all(lengths), lengths
        assert not await redis.exists("{test}:log")
        await listener.close()

        # Resuming 60 items back (window of 5) merges the partitions read from Redis.
        missed = await service.bucket.publish_many(("vm", f"m-{i}", ["nic"]) for i in range(60))
        resumed = await register(service.ws_url, v1("vm", ["nic"], since=first[-1]))
        assert resumed.reply["resumed"] is True
        assert [i["cursor"] for i in await resumed.take(60)] == missed
        assert await resumed.quiet()


async def test_partition_count_is_fixed_with_the_bucket(
    redis_server: RedisServer, make_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    four = ChangeBucket(connect(redis_server.url), "test", partitions=4)
    two = ChangeBucket(connect(redis_server.url), "test", partitions=2)
    learner = ChangeBucket(connect(redis_server.url), "test")
    try:
        await four.publish("vm", "a", ["nic"])
        with pytest.raises(PartitionMismatch, match="has 4 partition"):
            await two.publish("vm", "b", ["nic"])
        await learner.publish("vm", "c", ["nic"])  # None: whatever the bucket has
        assert await learner.log.partition_count() == 4
        assert [e.changed_resource_id for e in await learner.log.read(StreamId(0, 0))] == ["a", "c"]

        # A publisher configured with another count does not start.
        config = make_config(
            redis_server.url, bucket={"redisUrl": redis_server.url, "name": "test", "partitions": 2}
        )
        with pytest.raises(PartitionMismatch, match="has 4 partition"):
            async with start_publisher(config):
                pass
    finally:
        for bucket in (four, two, learner):
            await bucket.aclose()


async def test_max_items_trims_the_oldest_across_partitions(
    redis_server: RedisServer, make_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    bucket = {"redisUrl": redis_server.url, "name": "test", "partitions": 2}
    config = make_config(redis_server.url, bucket=bucket, maxItems=5, gcInterval=0.05)
    async with start_publisher(config) as service:
        cursors = await service.bucket.publish_many(("vm", f"vm-{i}", ["nic"]) for i in range(20))
        epoch = Position.decode(cursors[0]).epoch
        kept: list[str] = []
        for _ in range(200):  # the publisher's own trim task does it
            kept = [
                Position.single(epoch, e.position).encode()
                for e in await service.bucket.log.read(StreamId(0, 0))
            ]
            if len(kept) == 5:
                break
            await asyncio.sleep(0.05)
        assert kept == cursors[-5:], "exactly the newest maxItems items are kept"
        retention = await service.bucket.log.retention()
        horizon = Position.single(epoch, retention.trimmed).encode()
        assert horizon == cursors[-6], "the horizon moved"
