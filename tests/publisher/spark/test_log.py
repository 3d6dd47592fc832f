"""Batch reads of the change log, and how ranges of it are cut."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrameReader, SparkSession

from changefeed.cursor import Position, StreamId
from publisher.bucket import Change, ChangeBucket, connect
from publisher.spark.log import split
from tests.publisher.spark.test_stream import commit
from tests.servers import RedisServer


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
    assert first.published.timestamp() == Position.decode(first.cursor).position.ms / 1000

    after = reader.option("startingCursor", cursors[19]).load()
    assert sorted(r.cursor for r in after.collect()) == cursors[20:]
    assert reader.option("startingCursor", "latest").load().count() == 0


def test_an_empty_bucket_reads_as_no_rows(spark: SparkSession, options: dict[str, str]) -> None:
    assert spark.read.format("changefeed").options(**options).load().count() == 0


def test_cursors_of_another_bucket_are_refused(
    spark: SparkSession, redis_server: RedisServer, options: dict[str, str]
) -> None:
    asyncio.run(commit(redis_server.url, range(1)))
    foreign = Position.single("aaaaaaaaaa", StreamId(1, 0)).encode()
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


def test_a_batch_read_is_bounded_by_ending_cursor_and_timestamps(
    spark: SparkSession, redis_server: RedisServer, options: dict[str, str]
) -> None:
    cursors = asyncio.run(commit(redis_server.url, range(10)))
    def reader() -> DataFrameReader:  # a DataFrameReader is changed by each option()
        return spark.read.format("changefeed").options(**options)

    bounded = reader().option("startingCursor", cursors[2]).option("endingCursor", cursors[6])
    first = sorted(r.cursor for r in bounded.load().collect())
    asyncio.run(commit(redis_server.url, range(10, 15)))
    assert first == sorted(r.cursor for r in bounded.load().collect()) == cursors[3:7]

    def ms(cursor: str) -> int:
        return Position.decode(cursor).position.ms

    def iso(milliseconds: int) -> str:
        return datetime.fromtimestamp(milliseconds / 1000, tz=UTC).isoformat()

    timed = (
        reader().option("startingTimestamp", iso(ms(cursors[3])))
        .option("endingTimestamp", iso(ms(cursors[6])))
        .load().collect()
    )
    got = {r.cursor for r in timed}
    # Every change published within the interval, whatever its place among same-ms changes.
    assert got >= set(cursors[3:7])
    assert all(ms(cursors[3]) <= ms(c) <= ms(cursors[6]) for c in got)
    with pytest.raises(PySparkException, match="option 'endingTimestamp': got 'tomorrow'"):
        reader().option("endingTimestamp", "tomorrow").load().collect()
    with pytest.raises(PySparkException, match="either startingCursor or startingTimestamp"):
        reader().option("startingCursor", cursors[0]).option(
            "startingTimestamp", "2026-01-01").load().collect()


def test_a_read_with_state_and_a_read_of_the_store(
    spark: SparkSession, redis_server: RedisServer, options: dict[str, str]
) -> None:
    async def changes() -> None:
        bucket = ChangeBucket(connect(redis_server.url), "test")
        try:
            await bucket.commit_many([
                Change.put("vm", "a", ["nic"], {"n": 1}),
                Change.put("vm", "b", ["nic"], {"n": 2}),
                Change.put("vm", "a", ["nic"], {"n": 3}),
                Change.delete("vm", "b", ["nic"]),
                Change.put("net", "x", ["name"], {"name": "x"}),
            ])
        finally:
            await bucket.aclose()

    asyncio.run(changes())
    def reader() -> DataFrameReader:
        return spark.read.format("changefeed").options(**options)

    rows = reader().option("includeState", "true").load().orderBy("cursor").collect()
    assert [(r.id, r.state) for r in rows] == [
        ("a", '{"n":3}'), ("b", None), ("a", '{"n":3}'), ("b", None), ("x", '{"name":"x"}'),
    ]
    store = reader().option("table", "store").load()
    assert store.columns == ["resource", "id", "state"]
    assert sorted(tuple(r) for r in store.collect()) == [
        ("net", "x", '{"name":"x"}'), ("vm", "a", '{"n":3}'),
    ]
    vms_only = reader().option("table", "store").option("resource", "vm").load()
    assert [tuple(r) for r in vms_only.collect()] == [("vm", "a", '{"n":3}')]
    with pytest.raises(PySparkException, match="option 'endingCursor': got 'x'"):
        reader().option("table", "store").option("endingCursor", "x").load().collect()
