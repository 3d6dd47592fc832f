"""Batch reads of the change log, and how ranges of it are cut."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from changefeed.cursor import Cursor, StreamId
from publisher.bucket import connect
from publisher.spark.log import split
from tests.servers import RedisServer
from tests.spark.test_stream import commit


def test_a_batch_read_loads_the_retained_log(
    spark: SparkSession, redis_server: RedisServer, options: dict[str, str]
) -> None:
    cursors = asyncio.run(commit(redis_server.url, range(25)))
    reader = spark.read.format("changefeed").options(**options).option("numPartitions", "3")

    rows = reader.load().collect()
    assert [r.cursor for r in sorted(rows, key=lambda r: r.cursor)] == cursors
    assert sorted(r.id for r in rows) == sorted(f"vm-{n}" for n in range(25))
    first = min(rows, key=lambda r: r.cursor)
    assert (first.resource, first.subResources) == ("vm", ["nic"])
    assert first.published.timestamp() == Cursor.decode(first.cursor).position.ms / 1000

    after = reader.option("startingCursor", cursors[19]).load()
    assert sorted(r.cursor for r in after.collect()) == cursors[20:]
    assert reader.option("startingCursor", "latest").load().count() == 0


def test_an_empty_bucket_reads_as_no_rows(spark: SparkSession, options: dict[str, str]) -> None:
    assert spark.read.format("changefeed").options(**options).load().count() == 0


def test_cursors_of_another_bucket_are_refused(
    spark: SparkSession, redis_server: RedisServer, options: dict[str, str]
) -> None:
    asyncio.run(commit(redis_server.url, range(1)))
    foreign = Cursor("aaaaaaaaaa", StreamId(1, 0)).encode()
    reader = spark.read.format("changefeed").options(**options)
    with pytest.raises(PySparkException, match="of another bucket epoch"):
        reader.option("startingCursor", foreign).load().collect()
    with pytest.raises(PySparkException, match="option 'startingCursor': got 'yesterday'"):
        reader.option("startingCursor", "yesterday").load().collect()


def test_ranges_cover_the_interval_once() -> None:
    ranges = split("e", StreamId(1000, 3), StreamId(1010, 2), 4)
    assert ranges[0].after == StreamId(1000, 3) and ranges[-1].until == StreamId(1010, 2)
    assert all(a.until == b.after for a, b in itertools.pairwise(ranges))
    assert len(ranges) == 4
    assert split("e", StreamId(5, 0), StreamId(5, 9), 4)[0].until == StreamId(5, 9)
    assert split("e", StreamId(5, 9), StreamId(5, 9), 4) == []


def test_a_partitioned_bucket_is_written_and_read_in_commit_order(
    spark: SparkSession, config_options: Callable[..., dict[str, str]], redis_server: RedisServer
) -> None:
    options = config_options(
        bucket={"redisUrl": redis_server.url, "name": "test", "partitions": 4}
    )
    rows = [(f"vm-{n}", n) for n in range(40)]
    frame = spark.createDataFrame(rows, "uuid string, n int")
    (
        frame.write.format("changefeed").options(**options)
        .option("resource", "vm").option("idColumn", "uuid").option("subResources", "nic")
        .mode("append").save()
    )
    read = spark.read.format("changefeed").options(**options).option("numPartitions", "3")
    got = sorted(read.load().collect(), key=lambda r: r.cursor)
    assert sorted(r.id for r in got) == sorted(uuid for uuid, _ in rows)

    async def streams() -> list[int]:
        client = connect(redis_server.url)
        try:
            return [await client.xlen(f"{{test}}:log:{p}") for p in range(4)]
        finally:
            await client.aclose()

    lengths = asyncio.run(streams())
    assert sum(lengths) == 40 and all(lengths), "the sink created the bucket with 4 partitions"
