"""Streams: a micro-batch run again publishes nothing twice; the reader resumes from its
checkpoint with nothing lost and nothing repeated."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import cast

import orjson
import pytest
import redis
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from changefeed.cursor import Position
from changefeed.errors import OptionError
from publisher.bucket import Change, ChangeBucket, connect
from publisher.spark import Figures, committed_batches
from publisher.spark.progress import parse_entry
from tests.publisher.spark.test_sink import log_of
from tests.servers import RedisServer


def drop_commit(checkpoint: Path, batch_id: int) -> None:
    """What a driver that died after the sink's commit, before Spark's own, leaves behind."""
    (checkpoint / "commits" / str(batch_id)).unlink()
    (checkpoint / "commits" / f".{batch_id}.crc").unlink(missing_ok=True)


def run_stream_write(spark: SparkSession, source: Path, checkpoint: Path, url: str) -> None:
    query = (
        spark.readStream.schema("id string, name string").json(str(source))
        .writeStream.format("changefeed")
        .option("redisUrl", url).option("bucket", "test").option("resource", "network")
        .option("subResources", "name").option("state", "row")
        .option("checkpointLocation", str(checkpoint)).queryName("networks")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None


def test_a_micro_batch_run_again_publishes_nothing_twice(
    spark: SparkSession, redis_server: RedisServer, tmp_path: Path
) -> None:
    source, checkpoint = tmp_path / "source", tmp_path / "checkpoint"
    source.mkdir()
    (source / "0.json").write_text("".join(
        orjson.dumps({"id": f"net-{n}", "name": f"n{n}"}).decode() + "\n" for n in range(50)
    ))
    run_stream_write(spark, source, checkpoint, redis_server.url)
    assert len(log_of(redis_server.url)) == 50

    drop_commit(checkpoint, 0)  # Spark runs micro-batch 0 again on restart
    run_stream_write(spark, source, checkpoint, redis_server.url)
    assert len(log_of(redis_server.url)) == 50

    (source / "1.json").write_text('{"id": "net-50", "name": "n50"}\n')
    run_stream_write(spark, source, checkpoint, redis_server.url)
    log = log_of(redis_server.url)
    assert sorted(id for _, _, id in log) == sorted(f"net-{n}" for n in range(51))
    assert {(resource, tuple(subs)) for resource, subs, _ in log} == {("network", ("name",))}

    client = redis.Redis.from_url(redis_server.url)
    record = client.hgetall("{test}:spark:networks")
    assert sorted(record) == [b"0", b"1"]  # one entry per micro-batch, the chunks forgotten
    assert record[b"0"].split()[0] == b"50" and record[b"1"].split()[0] == b"1"
    state = client.hget("{test}:state:network", "net-7")
    assert isinstance(state, bytes)
    assert orjson.loads(state) == {
        "id": "net-7", "name": "n7"
    }


async def commit(url: str, ids: range) -> list[str]:
    bucket = ChangeBucket(connect(url), "test")
    try:
        return await bucket.commit_many(Change.publish("vm", f"vm-{n}", ["nic"]) for n in ids)
    finally:
        await bucket.aclose()


def run_stream_read(
    spark: SparkSession, url: str, checkpoint: Path, output: Path, per_trigger: int
) -> StreamingQuery:
    query = (
        spark.readStream.format("changefeed")
        .option("redisUrl", url).option("bucket", "test")
        .option("maxItemsPerTrigger", str(per_trigger)).option("numPartitions", "2")
        .load()
        .writeStream.format("json").option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None
    return query


def test_the_stream_reader_resumes_from_its_checkpoint(
    spark: SparkSession, redis_server: RedisServer, tmp_path: Path
) -> None:
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "output"
    cursors = asyncio.run(commit(redis_server.url, range(30)))
    query = run_stream_read(spark, redis_server.url, checkpoint, output, per_trigger=7)
    assert sorted(r.cursor for r in spark.read.json(str(output)).collect()) == cursors
    # Trigger.AvailableNow honours maxItemsPerTrigger; the progress shows the head (the lag).
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    assert [p["numInputRows"] for p in progress] == [7, 7, 7, 7, 2]
    assert orjson.loads(progress[0]["sources"][0]["latestOffset"]) == {"cursor": cursors[-1]}

    cursors += asyncio.run(commit(redis_server.url, range(30, 55)))
    run_stream_read(spark, redis_server.url, checkpoint, output, per_trigger=100)
    rows = spark.read.json(str(output)).collect()
    assert sorted(r.cursor for r in rows) == cursors  # nothing lost, nothing twice
    assert sorted(r.id for r in rows) == sorted(f"vm-{n}" for n in range(55))
    assert {(r.resource, tuple(r.subResources)) for r in rows} == {("vm", ("nic",))}


def test_each_micro_batch_keeps_its_figures_readable_by_batch_id(
    spark: SparkSession, redis_server: RedisServer, tmp_path: Path
) -> None:
    """The sink's metrics, which a query's progress has no place for (docs/spark.md): the task
    of the micro-batch of 50 rows fails after 3 chunks of 10 and its retry skips them; the one
    of 5 rows writes once."""

    @F.udf("string", useArrow=False)
    def op(id: str) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        first = context is not None and context.attemptNumber() == 0
        return "upsert" if first and id == "net-35" else "publish"  # upsert: a bad op

    source, checkpoint = tmp_path / "source", tmp_path / "checkpoint"
    source.mkdir()
    for name, ids in (("0.json", range(50)), ("1.json", range(50, 55))):
        (source / name).write_text("".join(
            orjson.dumps({"id": f"net-{n}", "name": f"n{n}"}).decode() + "\n" for n in ids
        ))
    options = {"redisUrl": redis_server.url, "bucket": "test"}
    query = (
        spark.readStream.schema("id string, name string").option("maxFilesPerTrigger", 1)
        .json(str(source)).withColumn("op", op("id"))
        .writeStream.format("changefeed").options(**options)
        .option("resource", "network").option("subResources", "name").option("opColumn", "op")
        .option("batchSize", "10").option("pipeline", "1")
        .option("checkpointLocation", str(checkpoint)).queryName("figures")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None

    batches = committed_batches(query, **options)
    progress = {p["batchId"]: p for p in query.recentProgress if p["numInputRows"]}
    assert sorted(batches) == sorted(progress) == [0, 1]
    for batch, committed in batches.items():
        assert committed.count == progress[batch]["sink"]["numOutputRows"]
        assert committed.first is not None and committed.last is not None
        assert committed.figures is not None and committed.figures.redis_seconds > 0
    # One micro-batch per file, in an order Spark picks (files of the same modification time).
    by_count = {committed.count: committed.figures for committed in batches.values()}
    retried, once = by_count[50], by_count[5]
    assert retried is not None and once is not None
    assert replace(retried, redis_seconds=0) == Figures(
        changes_written=20, chunks_written=2, chunks_skipped=3, changes_skipped=30
    )
    assert replace(once, redis_seconds=0) == Figures(changes_written=5, chunks_written=1)
    assert sorted(id for _, _, id in log_of(redis_server.url)) == sorted(
        f"net-{n}" for n in range(55)
    )
    # What Spark itself shows of the sink: the JVM class's name, no metrics of its own.
    sink = progress[1]["sink"]
    assert sink["description"].startswith(
        "org.apache.spark.sql.execution.datasources.v2.python.PythonTable@"
    )
    assert sink["metrics"] == {}
    with pytest.raises(OptionError, match="option 'queryName'"):
        committed_batches("", **options)


async def test_the_nemesis_stream_writer_publishes_once_across_a_failed_micro_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The nemesis' streaming writer (faults/nemesis/spark_writer.py) on its own: a
    micro-batch whose replica does not confirm fails, ending the query; the writer starts it
    again from its checkpoint, the micro-batch runs again under its batch id, and its change is
    published once and acknowledged at its cursor."""
    from faults.nemesis.spark_writer import StreamWriter
    from faults.oracle import History
    from faults.records import Outcome

    master = RedisServer(tmp_path / "master", tcp=True).start()
    replica = RedisServer(tmp_path / "replica", tcp=True, replica_of=master).start()
    bucket = ChangeBucket(connect(master.url), "test")
    history = History()
    writer = StreamWriter(spark, master.url, bucket, "stream", history, tmp_path, seed=1)
    try:
        await writer.once()
        assert (len(history.acked), writer.tries) == (1, 1)

        replica.pause()
        try:
            second = asyncio.create_task(writer.once())
            while writer.tries < 2:  # the micro-batch failed, the query was started again
                assert not second.done(), history.attempts
                await asyncio.sleep(0.1)
        finally:
            replica.resume()
        await second

        acked = history.acked
        assert [a.seq for a in acked] == [1, 2]
        unknown = [(a.id, a.seq) for a in history.attempts if a.outcome is Outcome.UNKNOWN]
        assert unknown == [(acked[1].id, 2)] * (writer.tries - 1), (
            "each failed run of micro-batch 1 is a try of unknown outcome")
        assert len(history.attempts) == len(acked) + len(unknown), "nothing failed"
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]],
                       redis.Redis.from_url(master.url).xrange("{test}:log"))
        assert [f[b"i"].decode() for _, f in entries] == [a.id for a in acked], "each once"
        assert [str(Position.decode(a.cursor).position) for a in acked if a.cursor] == [
            entry.decode() for entry, _ in entries], "acknowledged at its cursor"
        ledger = await bucket.ledgers.ledger("stream")
        figures = parse_entry(1, ledger[1]).figures
        assert figures is not None and (figures.changes_written, figures.chunks_skipped) == (
            0, 1), "the run that committed found the failed run's chunk in, sent nothing"
    finally:
        await writer.aclose()
        await bucket.aclose()
        replica.stop()
        master.stop()
