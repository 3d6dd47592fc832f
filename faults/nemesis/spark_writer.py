"""The nemesis' Spark writers (`--spark`): a batch job per change, and a Structured Streaming
query publishing a micro-batch per change, both through `format("changefeed")` (docs/spark.md).

`SparkWriter`: each write is one row, `{"uuid": id, "seq": n}` stored as the state
(`state=row`), under `txnAppId` = the writer's name and `txnVersion` = n: a try that failed (Redis
down, failing over) is run again with the same version, which publishes nothing when an earlier
try did commit, and the txn record (`ChangeBucket.ledgers.txn_record`) gives the cursor either
way. A Spark task is a one-shot client without a witness, so each job asks a replica to confirm
its change (`replicas=1`): acknowledged then means on both nodes, as for `changefeed publish
--replicas 1`.

`StreamWriter`: a streaming query reads a directory of JSON files (one row, one file per change,
`maxFilesPerTrigger=1`: one micro-batch per change) and writes them with `writeStream` under its
query name and checkpoint, `replicas=1` too. A micro-batch that fails (Redis away) ends the query,
as Spark does; the writer starts it again from its checkpoint, which runs that micro-batch again
under the same batch id, and the sink's chunk keys and ledger publish it once. A change is
acknowledged when the query's ledger (`{bucket}:spark:<query>`) records its micro-batch: the
entry's first cursor is the change's.

Spark costs a core for seconds at its start and a moment per job, so the writers are opt-in (the
suite's 60-second nemesis runs without them): `python -m faults.nemesis --spark`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from changefeed.errors import BucketUnavailable
from changefeed_testing.servers import scaled
from faults.harness import RESOURCE, SUBS
from faults.nemesis.writers import RETRY_FOR, RETRY_PAUSE, Writer
from faults.oracle import History
from publisher import ChangeBucket
from publisher.spark.progress import parse_entry

ROOT = Path(__file__).resolve().parents[2]


def session() -> Any:
    """A local SparkSession of one core (the system under test needs the other), whose failed
    task is not tried again inside its job (`local[1]`: one attempt): a task's attempt may
    write its change, and a fault that destroys history may lose that write and its chunk key,
    so the next attempt writes it again under another cursor. The writers see a job (or a
    micro-batch) fail, not its attempts: with one attempt each, every try they record as of
    unknown outcome stands for at most one write, as the oracle counts them."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1]").appName("nemesis")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "1")
             .config("spark.default.parallelism", "1")
             .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=error")
             .getOrCreate())
    spark.sparkContext.setLogLevel("OFF")  # a failed job's task errors are expected here
    return spark


SCHEMA = "uuid string, seq long"


def sink_options(url: str, bucket: ChangeBucket) -> dict[str, str]:
    """The sink's options: the bucket through Sentinel, each row stored as its change's state,
    acknowledged once on a replica too."""
    return {"redisUrl": url, "bucket": bucket.name, "resource": RESOURCE, "idColumn": "uuid",
            "subResources": ",".join(SUBS), "state": "row", "replicas": "1",
            "replicasTimeout": "2"}


def _activate(spark: Any) -> None:
    """Spark finds data sources through the JVM thread's active session: set it for this
    (worker) thread."""
    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


class SparkWriter(Writer):
    """One job per change, `replicas=1`, retried under its txnVersion until acknowledged."""

    def __init__(self, spark: Any, url: str, bucket: ChangeBucket, name: str,
                 history: History, *, pace: float = 2.0, seed: int = 0) -> None:
        super().__init__(name, history, pace=pace, seed=seed)
        self.spark = spark
        self.bucket = bucket
        """Where the txn record is read from (the same bucket, through Sentinel)."""
        self.options = sink_options(url, bucket) | {"txnAppId": name}

    def _write(self, id: str, seq: int) -> None:
        spark = self.spark
        _activate(spark)
        rows = spark.createDataFrame([(id, seq)], SCHEMA)
        (rows.write.format("changefeed").mode("append").options(**self.options)
         .option("txnVersion", str(seq)).save())

    async def _cursor(self, id: str, seq: int) -> str | None:
        """The cursor of the change of version `seq`, from the txn record (None: the record is
        of another version, or unreadable: Redis lost it or is away)."""
        for _ in range(20):
            try:
                record = await self.bucket.ledgers.txn_record(self.name)
            except BucketUnavailable:
                await asyncio.sleep(RETRY_PAUSE)
                continue
            if record is None:
                return None
            version, count, first, _ = record.split()
            if int(version) != seq or int(count) != 1:
                return None
            return first
        return None

    async def once(self) -> None:
        id, seq = self.next()
        deadline = time.monotonic() + scaled(RETRY_FOR)
        since = self.history.tick()
        while True:
            self.tries += 1
            try:
                await asyncio.to_thread(self._write, id, seq)
            except Exception:  # a failed job (Py4J's error): its task may have committed
                if await self._try_again(id, seq, deadline, unknown=True):
                    continue
                return
            cursor = await self._cursor(id, seq)
            if cursor is None:
                self.history.unknown(id, seq, time.monotonic())
                return
            self._acked(id, seq, cursor, since)
            return


class StreamWriter(Writer):
    """A streaming query that publishes each file dropped in its inbox as one micro-batch;
    started again from its checkpoint whenever a failed micro-batch ends it."""

    def __init__(self, spark: Any, url: str, bucket: ChangeBucket, name: str,
                 history: History, directory: Path, *, pace: float = 2.0,
                 seed: int = 0) -> None:
        super().__init__(name, history, pace=pace, seed=seed)
        self.spark = spark
        self.bucket = bucket
        """Where the query's ledger is read from (the same bucket, through Sentinel)."""
        self.options = sink_options(url, bucket)
        self.inbox = directory / f"{name}-inbox"
        self.staging = directory / f"{name}-staging"
        """Files are written here, then renamed into the inbox: Spark sees them whole."""
        self.checkpoint = directory / f"{name}-checkpoint"
        for folder in (self.inbox, self.staging):
            folder.mkdir(parents=True, exist_ok=True)
        self.dropped = 0
        """Files dropped so far: the next file is micro-batch `dropped` (one file per
        micro-batch, taken oldest first)."""
        self.unsettled: dict[int, tuple[str, int]] = {}
        """The change of each micro-batch dropped and not yet seen in the ledger, given up on
        or not: the query may publish it yet."""
        self.query: Any = None

    def _start(self) -> None:
        _activate(self.spark)
        files = (self.spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
                 .json(str(self.inbox)))
        self.query = (files.writeStream.format("changefeed").options(**self.options)
                      .option("checkpointLocation", str(self.checkpoint))
                      .queryName(self.name).trigger(processingTime="200 milliseconds").start())

    def _active(self) -> bool:
        return self.query is not None and bool(self.query.isActive)

    async def _running(self) -> None:
        """The query running: started again if a micro-batch failed and ended it (a start that
        fails at once is tried on the next call). The micro-batch that failed, the oldest one
        unsettled, may have written its change (and a failover may lose that, and its chunk
        key, so that the next run writes it again under another cursor): each failed run is
        recorded as a try of unknown outcome, as the other writers record theirs."""
        if await asyncio.to_thread(self._active):
            return
        if self.query is not None:
            self.failures += 1
            if self.unsettled:
                self.history.unknown(*self.unsettled[min(self.unsettled)], time.monotonic())
        self.tries += 1  # a try is a start of the query
        try:
            await asyncio.to_thread(self._start)
        except Exception:  # Py4J's error: the sink's options check could not reach Redis
            self.failures += 1

    def _drop(self, batch: int, id: str, seq: int) -> None:
        staged = self.staging / f"{batch:08}.json"
        staged.write_bytes(orjson.dumps({"uuid": id, "seq": seq}) + b"\n")
        os.replace(staged, self.inbox / staged.name)

    async def _first_cursor(self, batch: int) -> str | None:
        """The cursor of micro-batch `batch`'s one change, once the ledger records it (the
        micro-batches it records are settled)."""
        try:
            ledger = await self.bucket.ledgers.ledger(self.name)
        except BucketUnavailable:
            return None
        for settled in self.unsettled.keys() & ledger.keys():
            del self.unsettled[settled]
        entry = ledger.get(batch)
        if entry is None:
            return None
        committed = parse_entry(batch, entry)
        if committed.count != 1 or committed.first is None:
            raise AssertionError(f"micro-batch {batch} of {self.name} is {entry!r}: "
                                 "one file of one row should be one change")
        return committed.first

    async def once(self) -> None:
        id, seq = self.next()
        batch = self.dropped
        since = self.history.tick()
        self._drop(batch, id, seq)
        self.unsettled[batch] = (id, seq)
        self.dropped += 1
        deadline = time.monotonic() + scaled(RETRY_FOR)
        while True:
            await self._running()
            cursor = await self._first_cursor(batch)
            if cursor is not None:
                self._acked(id, seq, cursor, since)
                return
            if time.monotonic() > deadline:
                # The file stays in the inbox: the query may still publish it.
                self.history.unknown(id, seq, time.monotonic())
                self.history.failed(id, seq, time.monotonic())
                return
            await asyncio.sleep(RETRY_PAUSE)

    async def aclose(self) -> None:
        if await asyncio.to_thread(self._active):
            await asyncio.to_thread(self.query.stop)


__all__ = ["SparkWriter", "StreamWriter", "session"]
