"""Spark and a bucket on both layouts (one Redis, the session's 3-master Redis Cluster): the sink
commits (per shard) and a listener gets each row once; batch and streaming reads plan per shard,
with the bucket's cursors and offsets (composite for the cluster): a restarted stream loses
nothing and repeats nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from pyspark.sql import SparkSession
from websockets.asyncio.client import connect

from changefeed.cursor import Position
from publisher.bucket import Change, open_bucket
from publisher.config.settings import load_config
from tests.conftest import PublisherFactory
from tests.publisher.spark.test_sink import vms, write
from tests.servers import RedisCluster, RedisServer, scaled, write_config

PARTITIONS = 4


@pytest.fixture
def bucket_url(layout: str, request: pytest.FixtureRequest) -> str:
    """The Redis URL of the layout's bucket: a private redis-server, or the session's cluster."""
    if layout == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        return server.url
    cluster: RedisCluster = request.getfixturevalue("redis_cluster")
    return cluster.url


def layout_options(url: str, tmp_path: Path, name: str) -> dict[str, str]:
    path = write_config(
        tmp_path / f"{name}.js", url, bucket={"redisUrl": url, "name": name,
                                                "partitions": PARTITIONS},
    )
    return {"config": str(path)}


def shards_of(cursor: str) -> int:
    """How many positions `cursor` holds (one for an ordered bucket's)."""
    vector = Position.decode(cursor)
    assert vector.composite == (len(vector.positions) > 1)
    return len(vector.positions)


@pytest.mark.timeout(600)
async def test_the_sink_reaches_a_listener_and_a_batch_read_gets_every_row(
    spark: SparkSession, layout: str, bucket_url: str, tmp_path: Path,
    start_publisher: PublisherFactory,
) -> None:
    options = layout_options(bucket_url, tmp_path, "sparkc")
    shards = PARTITIONS if layout == "cluster" else 1
    async with (
        start_publisher(load_config(options["config"])) as service,
        connect(service.ws_url, additional_headers={"Accept-Version": "~1"}) as ws,
    ):
        registration = {"instance": "i-1", "service": "spark-test",
                        "changeKind": {"resource": "vm", "subResources": ["nic"]}}
        await ws.send(orjson.dumps(registration).decode())
        orjson.loads(await asyncio.wait_for(ws.recv(), scaled(5)))
        await asyncio.to_thread(
            write, vms(spark, 300), options, resource="vm", idColumn="uuid",
            subResources="nic", state="row",
        )
        items = [orjson.loads(await asyncio.wait_for(ws.recv(), scaled(10))) for _ in range(300)]
        ids = sorted(item["changedResourceId"] for item in items)
        assert ids == [f"vm-{n:04d}" for n in range(300)], "each row once"
        stored = await service.bucket.get("vm", "vm-0042")
        assert stored is not None and orjson.loads(stored)["ram"] == 42

    def batch() -> list[str]:
        session = spark
        session._jvm.org.apache.spark.sql.SparkSession.setActiveSession(session._jsparkSession)  # type: ignore[union-attr]
        frame = spark.read.format("changefeed").options(**options)
        rows = frame.option("numPartitions", "3").load().collect()
        for row in rows:
            assert shards_of(row.cursor) == shards
        return sorted(row.id for row in rows)

    assert await asyncio.to_thread(batch) == ids



@pytest.mark.timeout(600)
def test_a_stream_read_resumes_from_its_offset(
    spark: SparkSession, layout: str, bucket_url: str, tmp_path: Path
) -> None:
    options = layout_options(bucket_url, tmp_path, "sparks")
    shards = PARTITIONS if layout == "cluster" else 1
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "output"

    async def commit(ids: range) -> None:
        bucket = open_bucket(bucket_url, "sparks", None, PARTITIONS)
        try:
            await bucket.commit_many(Change.publish("vm", f"vm-{n}", ["nic"]) for n in ids)
        finally:
            await bucket.aclose()

    def stream(per_trigger: int) -> list[str]:
        query = (
            spark.readStream.format("changefeed").options(**options)
            .option("maxItemsPerTrigger", str(per_trigger)).option("numPartitions", "2")
            .load()
            .writeStream.format("json").option("path", str(output))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        assert query.exception() is None
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        assert all(p["numInputRows"] <= per_trigger for p in progress)
        offset = orjson.loads(progress[-1]["sources"][0]["endOffset"])["cursor"]
        assert shards_of(offset) == shards
        return sorted(row.id for row in spark.read.json(str(output)).collect())

    asyncio.run(commit(range(30)))
    assert stream(12) == sorted(f"vm-{n}" for n in range(30))
    asyncio.run(commit(range(30, 55)))
    assert stream(100) == sorted(f"vm-{n}" for n in range(55)), (
        "the restarted stream goes on from its offset: nothing lost, nothing twice"
    )
