"""Batch writes: rows reach listeners and the store, retried tasks publish once, bad options
write nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import orjson
import pyarrow as pa
import pytest
import redis
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType
from websockets.asyncio.client import connect

from publisher.config.settings import load_config
from publisher.spark.options import sink_options
from publisher.spark.sink import Span, TaskWritten, abort_report, total, write_task
from tests.conftest import PublisherFactory
from tests.servers import RedisServer, scaled


def write(df: DataFrame, options: dict[str, str], **extra: str) -> None:
    # Spark finds data sources through the JVM thread's active session; tests write from threads.
    session = df.sparkSession
    session._jvm.org.apache.spark.sql.SparkSession.setActiveSession(session._jsparkSession)  # type: ignore[union-attr]
    df.write.format("changefeed").mode("append").options(**options).options(**extra).save()


def log_of(url: str) -> list[tuple[str, list[str], str]]:
    """(resource, sub-resources, id) of every item in the test bucket's log, oldest first."""
    client = redis.Redis.from_url(url)
    try:
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], client.xrange("{test}:log"))
        return [
            (f[b"r"].decode(), orjson.loads(f[b"s"]), f[b"i"].decode()) for _, f in entries
        ]
    finally:
        client.close()


def vms(spark: SparkSession, count: int) -> DataFrame:
    return spark.range(count).select(
        F.format_string("vm-%04d", "id").alias("uuid"),
        F.col("id").cast("int").alias("ram"),
        F.lit("running").alias("status"),
    )


async def test_batch_write_reaches_a_listener_on_a_publisher(
    spark: SparkSession,
    config_options: Callable[..., dict[str, str]],
    start_publisher: PublisherFactory,
) -> None:
    options = config_options()
    async with (
        start_publisher(load_config(options["config"])) as service,
        connect(service.ws_url, additional_headers={"Accept-Version": "~1"}) as ws,
    ):
        registration = {"instance": "i-1", "service": "spark-test",
                        "changeKind": {"resource": "vm", "subResources": ["nic"]}}
        await ws.send(orjson.dumps(registration).decode())
        reply = orjson.loads(await asyncio.wait_for(ws.recv(), scaled(5)))
        assert reply["bootstrapRoute"] == "/vms"

        await asyncio.to_thread(
            write, vms(spark, 300), options, resource="vm", idColumn="uuid",
            subResources="nic,alias", state="row",
        )
        items = [orjson.loads(await asyncio.wait_for(ws.recv(), scaled(10))) for _ in range(300)]

        assert sorted(item["changedResourceId"] for item in items) == [
            f"vm-{n:04d}" for n in range(300)
        ]
        assert {tuple(item["changeKind"]["subResources"]) for item in items} == {("nic", "alias")}
        cursors = [item["cursor"] for item in items]
        assert cursors == sorted(cursors) and len(set(cursors)) == 300
        stored = await service.bucket.get("vm", "vm-0042")
        assert stored is not None
        assert orjson.loads(stored) == {"uuid": "vm-0042", "ram": 42, "status": "running"}


def test_the_store_holds_the_rows_puts_and_deletes(
    spark: SparkSession, redis_server: RedisServer, config_options: Callable[..., dict[str, str]]
) -> None:
    options = config_options()
    rows = spark.createDataFrame(
        [("a", "put", '{"n": 1}', ["nic"]), ("b", "put", '{"n": 2}', ["alias"]),
         ("c", "put", '{"n": 3}', ["nic", "state"])],
        "id string, op string, doc string, subs array<string>",
    )
    write(rows, options, resource="vm", subResourcesColumn="subs", stateColumn="doc",
          opColumn="op")
    write(spark.createDataFrame([("b", "delete", None, "state")], "id string, op string, "
          "doc string, subs string"), options, resource="vm", subResourcesColumn="subs",
          stateColumn="doc", opColumn="op")

    client = redis.Redis.from_url(redis_server.url)
    assert client.hgetall("{test}:state:vm") == {b"a": b'{"n":1}', b"c": b'{"n":3}'}
    assert client.zrange("{test}:index:vm", 0, -1) == [b"a", b"c"]
    assert log_of(redis_server.url)[-1] == ("vm", ["state"], "b")
    assert sorted(log_of(redis_server.url)[:3]) == [
        ("vm", ["alias"], "b"), ("vm", ["nic"], "a"), ("vm", ["nic", "state"], "c")
    ]
    assert client.keys("{test}:spark:*") == []  # the job's record is gone with the job


def test_a_retried_task_publishes_each_row_once(
    spark: SparkSession,
    redis_server: RedisServer,
    options: dict[str, str],
) -> None:
    """The first attempt of each task meets a bad row after committing some chunks and fails;
    the second attempt sends only the rest."""

    @F.udf("string", useArrow=False)
    def op(n: int) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        first = context is not None and context.attemptNumber() == 0
        return "upsert" if first and n % 2000 == 1500 else "publish"

    rows = spark.range(4000).repartitionByRange(2, "id").sortWithinPartitions("id")
    rows = rows.select(F.format_string("vm-%04d", "id").alias("uuid"), op("id").alias("op"))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        write(rows, options, resource="vm", idColumn="uuid", subResources="nic", opColumn="op",
              batchSize="50", pipeline="1")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    ids = [id for _, _, id in log_of(redis_server.url)]
    assert sorted(ids) == [f"vm-{n:04d}" for n in range(4000)]
    stats = redis.Redis.from_url(redis_server.url).info("commandstats")
    assert stats["cmdstat_xadd"]["calls"] == 4000
    assert stats["cmdstat_evalsha"]["calls"] >= 4000 // 50 + 2 * 1400 // 50  # chunks sent twice


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"resource": "vm", "subResources": "nic"},
         "option 'idColumn': got 'id', expected a column"),
        ({"resource": "disk", "idColumn": "uuid", "subResources": "nic"},
         "option 'resource': got 'disk', expected a resource of the config (vm, network)"),
        ({"resource": "vm", "idColumn": "uuid", "subResources": "nic,disks"},
         "option 'subResources': got 'nic,disks', expected sub-resources of 'vm'"),
        ({"resource": "vm", "idColumn": "uuid"}, "either subResources (names) or "
         "subResourcesColumn"),
        ({"resource": "vm", "idColumn": "uuid", "subResources": "nic", "batchSize": "0"},
         "option 'batchSize': got '0', expected a positive integer"),
        ({"resource": "vm", "idColumn": "ram", "subResources": "nic", "state": "all"},
         "option 'state': got 'all'"),
        ({"resource": "vm", "idColumn": "uuid", "subResources": "nic", "replicas": "none"},
         "option 'replicas': got 'none', expected a positive integer"),
        ({"resource": "vm", "idColumn": "uuid", "subResources": "nic", "replicas": "1",
          "replicasTimeout": "-1"},
         "option 'replicasTimeout': got '-1', expected a positive number of seconds"),
    ],
)
def test_bad_options_fail_before_writing(
    spark: SparkSession,
    redis_server: RedisServer,
    config_options: Callable[..., dict[str, str]],
    extra: dict[str, str],
    message: str,
) -> None:
    with pytest.raises(PySparkException, match="OptionError") as failure:
        write(vms(spark, 10), config_options(), **extra)
    assert message in str(failure.value)
    assert log_of(redis_server.url) == []


def test_unreachable_redis_fails_before_any_task(
    spark: SparkSession, redis_server: RedisServer
) -> None:
    url = f"unix://{redis_server.directory}/nothing-here.sock"
    with pytest.raises(PySparkException, match="BucketUnavailable") as failure:
        write(vms(spark, 10), {"redisUrl": url, "bucket": "test"}, resource="vm",
              idColumn="uuid", subResources="nic")
    assert f"bucket 'test' at {url}: Redis unreachable" in str(failure.value)


def test_overwrite_and_missing_bucket_are_refused(spark: SparkSession) -> None:
    with pytest.raises(PySparkException, match="option 'config': got None"):
        write(vms(spark, 1), {}, resource="vm", idColumn="uuid", subResources="nic")
    with pytest.raises(PySparkException, match="expected append: a change feed only grows"):
        vms(spark, 1).write.format("changefeed").mode("overwrite").save()


def test_a_bad_row_fails_the_job_and_the_abort_says_what_was_written(
    spark: SparkSession, redis_server: RedisServer, options: dict[str, str]
) -> None:
    rows = spark.createDataFrame([("a", "put"), ("b", "upsert")], "id string, op string")
    with pytest.raises(PySparkException, match="'op' is 'upsert', expected one of put, delete"):
        write(rows.coalesce(1), options, resource="vm", subResources="nic", opColumn="op",
              state="row")
    assert log_of(redis_server.url) == []  # the chunk with the bad row was not sent

    first = TaskWritten(0, 2, Span(3, "e.01", "e.03"), 0)
    second = TaskWritten(1, 1, Span(2, "e.02", "e.05"), 1)
    assert total([first, None, second]) == Span(5, "e.01", "e.05")
    assert abort_report([first, None, second])["written"] == "5 changes (e.01 .. e.05)"
    assert abort_report([first, None, second])["tasks_failed"] == 1


def test_a_put_whose_state_is_not_an_object_fails_the_job(
    spark: SparkSession, redis_server: RedisServer, options: dict[str, str]
) -> None:
    rows = spark.createDataFrame([("a", '{"x": 1}'), ("b", "[1, 2]")], "id string, j string")
    with pytest.raises(PySparkException,
                       match="vm 'b': a put's state must be a JSON object, got array"):
        write(rows.coalesce(1), options, resource="vm", subResources="nic", stateColumn="j")
    rows = spark.createDataFrame([("a", None)], "id string, j string")
    with pytest.raises(PySparkException, match=r"vm 'a': a put's state must be a JSON object, "
                                               r"got null"):
        write(rows, options, resource="vm", subResources="nic", stateColumn="j")
    rows = spark.createDataFrame([("a", "publish"), ("b", "put")], "id string, op string")
    with pytest.raises(PySparkException, match=r"vm 'b': a put's state must be a JSON object, "
                                               r"got null \(a change without a state is a "
                                               r"publish\)"):
        write(rows.coalesce(1), options, resource="vm", subResources="nic", opColumn="op")
    assert log_of(redis_server.url) == []  # the chunk with the bad row was not sent


def test_a_retried_task_that_sees_its_rows_in_another_order_publishes_nothing_twice(
    redis_server: RedisServer,
) -> None:
    """The executor's side alone (no Spark needed): a second attempt of a task whose chunks come
    in another order, with their rows in another order, finds every chunk by its content key."""
    schema = StructType([StructField("uuid", StringType()), StructField("op", StringType())])
    options = sink_options(
        {"redisUrl": redis_server.url, "bucket": "test", "resource": "vm", "idColumn": "uuid",
         "subResources": "nic", "opColumn": "op", "batchSize": "10", "pipeline": "2"},
        schema, streaming=False,
    )
    # Two identical chunks at the end: their keys differ by their occurrence.
    rows = [(f"vm-{n:02d}", "publish") for n in range(40)] + [("vm-00", "publish")] * 20

    def batches(order: list[tuple[str, str]], size: int) -> Iterator[pa.RecordBatch]:
        for start in range(0, len(order), size):
            part = order[start : start + size]
            yield pa.RecordBatch.from_pydict({"uuid": [u for u, _ in part],
                                              "op": [o for _, o in part]})

    first = write_task(batches(rows, 7), options, "job:t", 0, 3)
    assert (first.written.count, first.skipped, first.chunks) == (60, 0, 6)
    # Chunks reversed, the rows of each reversed: the same chunks, in another order.
    chunked = [rows[i : i + 10] for i in range(0, len(rows), 10)]
    retry_rows = [row for chunk in reversed(chunked) for row in reversed(chunk)]
    retry = write_task(batches(retry_rows, 10), options, "job:t", 0, 3)
    assert (retry.written, retry.skipped) == (first.written, 60)
    assert len(log_of(redis_server.url)) == 60
    # Another task with the same rows is other changes.
    assert write_task(batches(rows, 60), options, "job:t", 0, 4).skipped == 0
    assert len(log_of(redis_server.url)) == 120


def test_a_txn_version_already_committed_publishes_nothing(
    spark: SparkSession, redis_server: RedisServer, options: dict[str, str]
) -> None:
    frame = vms(spark, 30)
    txn = {"resource": "vm", "idColumn": "uuid", "subResources": "nic", "txnAppId": "nightly"}
    client = redis.Redis.from_url(redis_server.url)
    write(frame, options, **txn, txnVersion="1")
    assert len(log_of(redis_server.url)) == 30
    calls = client.info("commandstats")["cmdstat_evalsha"]["calls"]
    write(frame, options, **txn, txnVersion="1")  # the same job submitted again
    write(frame, options, **txn, txnVersion="0")  # an older one
    assert len(log_of(redis_server.url)) == 30
    assert client.info("commandstats")["cmdstat_evalsha"]["calls"] == calls  # nothing sent

    write(frame, options, **txn, txnVersion="2")
    assert len(log_of(redis_server.url)) == 60
    record = client.get("{test}:sparktxn:nightly")
    assert isinstance(record, bytes) and record.split()[:2] == [b"2", b"30"]
    ttl = client.pttl("{test}:sparktxn:nightly")
    assert isinstance(ttl, int) and 0 < ttl <= 7 * 24 * 3600 * 1000  # it expires
    write(frame, options, **txn, txnVersion="3", recordRetention="60")
    ttl = client.pttl("{test}:sparktxn:nightly")
    assert isinstance(ttl, int) and 0 < ttl <= 60_000


def test_a_txn_job_run_again_after_its_driver_died_publishes_nothing_twice(
    spark: SparkSession, redis_server: RedisServer, options: dict[str, str]
) -> None:
    """The driver died after the tasks committed, before it recorded the version: the job
    submitted again finds every chunk by its key (named after the app id and the version)."""
    frame = vms(spark, 40).repartition(3)
    txn = {"resource": "vm", "idColumn": "uuid", "subResources": "nic", "batchSize": "7",
           "txnAppId": "hourly", "txnVersion": "5"}
    write(frame, options, **txn)
    client = redis.Redis.from_url(redis_server.url)
    client.delete("{test}:sparktxn:hourly")
    write(frame, options, **txn)
    assert len(log_of(redis_server.url)) == 40
    assert client.info("commandstats")["cmdstat_xadd"]["calls"] == 40
    assert client.get("{test}:sparktxn:hourly") is not None


def test_a_bad_row_fails_at_its_chunk_inside_a_large_arrow_batch(
    spark: SparkSession, redis_server: RedisServer, options: dict[str, str]
) -> None:
    rows = spark.range(1000).coalesce(1).select(
        F.format_string("vm-%04d", "id").alias("uuid"),
        F.when(F.col("id") == 750, "upsert").otherwise("publish").alias("op"),
    )
    with pytest.raises(PySparkException, match="'op' is 'upsert'"):
        write(rows, options, resource="vm", idColumn="uuid", subResources="nic", opColumn="op",
              batchSize="100")
    ids = [id for _, _, id in log_of(redis_server.url)]
    assert sorted(ids) == [f"vm-{n:04d}" for n in range(700)]  # the 7 chunks before it


def test_maps_are_stored_as_json_objects(
    spark: SparkSession, redis_server: RedisServer, options: dict[str, str]
) -> None:
    rows = spark.sql(
        "select 'a' as id, map('x', 1, 'y', 2) as tags, "
        "named_struct('m', map(1, array(map('k', 'v')))) as nested, array(map('z', 0)) as listed"
    )
    write(rows, options, resource="vm", subResources="nic", state="row")
    state = redis.Redis.from_url(redis_server.url).hget("{test}:state:vm", "a")
    assert isinstance(state, bytes)
    expected = rows.select(F.to_json(F.struct("*")).alias("j")).first()
    assert expected is not None
    assert orjson.loads(state) == orjson.loads(expected["j"])
    assert orjson.loads(state)["tags"] == {"x": 1, "y": 2}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"redisUrl": "redis://localhost:notaport/0"},
         "option 'redisUrl': got 'redis://localhost:notaport/0', expected a URL with a valid port"),
        ({"redisUrl": "localhost:6379"},
         "option 'redisUrl': got 'localhost:6379', expected a redis://, rediss://, unix:// or "
         "redis+sentinel:// URL"),
        ({"bucket": "bad name!"},
         "option 'bucket': got 'bad name!', expected a bucket name of letters, digits"),
        ({"idColum": "uuid"}, "option 'idcolum': got 'uuid', expected one of the options config"),
        ({"txnAppId": "nightly"}, "option 'txnVersion': got None, expected txnAppId and "
         "txnVersion together"),
        ({"txnAppId": "nightly", "txnVersion": "-1"},
         "option 'txnVersion': got '-1', expected a non-negative integer"),
    ],
)
def test_bad_values_fail_before_writing_and_name_the_option(
    spark: SparkSession,
    redis_server: RedisServer,
    options: dict[str, str],
    extra: dict[str, str],
    message: str,
) -> None:
    with pytest.raises(PySparkException, match="OptionError") as failure:
        write(vms(spark, 10), {**options, **extra}, resource="vm", idColumn="uuid",
              subResources="nic")
    assert message in str(failure.value)
    assert log_of(redis_server.url) == []
    assert redis.Redis.from_url(redis_server.url).keys("{bad*") == []


def test_with_sort_rows_a_retry_that_gets_its_rows_in_any_order_publishes_nothing_twice(
    redis_server: RedisServer,
) -> None:
    """After a shuffle a retried task may get its rows in another order, across chunks: with
    sortRows the task's changes are cut into chunks in a canonical order."""
    schema = StructType([StructField("uuid", StringType()), StructField("op", StringType())])
    options = sink_options(
        {"redisUrl": redis_server.url, "bucket": "test", "resource": "vm", "idColumn": "uuid",
         "subResources": "nic", "opColumn": "op", "batchSize": "10", "sortRows": "true"},
        schema, streaming=False,
    )
    rows = [(f"vm-{n:02d}", "publish") for n in range(45)]

    def batches(order: list[tuple[str, str]]) -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pydict({"uuid": [u for u, _ in order],
                                          "op": [o for _, o in order]})

    first = write_task(batches(rows), options, "job:s", 0, 1)
    shuffled = rows[7::3] + rows[::3] + rows[2::3][::-1] + rows[1:7:3]
    assert sorted(shuffled) == rows
    retry = write_task(batches(shuffled), options, "job:s", 0, 1)
    assert (retry.written, retry.skipped, retry.chunks_skipped) == (first.written, 45, 5)
    assert len(log_of(redis_server.url)) == 45


def test_with_replicas_a_task_waits_for_them_and_fails_without_them(
    spark: SparkSession, tmp_path: Path
) -> None:
    """`replicas`: each task returns once that many replicas have its changes (Redis WAIT), so a
    failover cannot lose what the job was told is written; a replica that does not confirm in
    `replicasTimeout` fails the task (and, tried again, the job), saying the changes are on the
    master only."""
    master = RedisServer(tmp_path / "master", tcp=True).start()
    replica = RedisServer(tmp_path / "replica", tcp=True, replica_of=master).start()
    try:
        options = {"redisUrl": master.url, "bucket": "test"}
        write(vms(spark, 20).coalesce(1), options, resource="vm", idColumn="uuid",
              subResources="nic", replicas="1")
        assert len(log_of(replica.url)) == 20, "the replica had them when the job returned"

        replica.pause()
        try:
            with pytest.raises(PySparkException, match="ReplicationTimeout") as failure:
                write(vms(spark, 25).coalesce(1), options, resource="vm", idColumn="uuid",
                      subResources="alias", replicas="1", replicasTimeout="0.3")
        finally:
            replica.resume()
        assert "written on the master, but only 0 of 1 replica(s) confirmed it" in str(
            failure.value)
        assert len(log_of(master.url)) == 45, "on the master: the error says so"
    finally:
        replica.stop()
        master.stop()
