"""The nemesis' Spark writer (`--spark`): a PySpark job that writes one change per job through
`format("changefeed")`, as a batch job run again and again would (docs/spark.md).

Each write is one row, `{"uuid": id, "seq": n}` stored as the state (`state=row`), under
`txnAppId` = the writer's name and `txnVersion` = n: a try that failed (Redis down, failing over)
is run again with the same version, which publishes nothing when an earlier try did commit, and
the txn record (`ChangeBucket.ledgers.txn_record`) gives the cursor either way. A Spark task is a
one-shot client without a witness, so each job asks a replica to confirm its change
(`replicas=1`): acknowledged then means on both nodes, as for `changefeed publish --replicas 1`.

Spark costs a core for seconds at its start and a moment per job, so the writer is opt-in (the
suite's 60-second nemesis runs without it): `python -m tests.faults.nemesis --spark`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from changefeed.errors import BucketUnavailable
from publisher import ChangeBucket
from tests.faults.harness import RESOURCE, SUBS
from tests.faults.nemesis.writers import RETRY_FOR, RETRY_PAUSE, Writer
from tests.faults.oracle import History
from tests.servers import scaled

ROOT = Path(__file__).resolve().parents[3]


def session() -> Any:
    """A local SparkSession of one core (the system under test needs the other)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1,2]").appName("nemesis")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "1")
             .config("spark.default.parallelism", "1")
             .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=error")
             .getOrCreate())
    spark.sparkContext.setLogLevel("OFF")  # a failed job's task errors are expected here
    return spark


class SparkWriter(Writer):
    """One job per change, `replicas=1`, retried under its txnVersion until acknowledged."""

    def __init__(self, spark: Any, url: str, bucket: ChangeBucket, name: str,
                 history: History, *, pace: float = 2.0, seed: int = 0) -> None:
        super().__init__(name, history, pace=pace, seed=seed)
        self.spark = spark
        self.bucket = bucket
        """Where the txn record is read from (the same bucket, through Sentinel)."""
        self.options = {"redisUrl": url, "bucket": bucket.name, "resource": RESOURCE,
                        "idColumn": "uuid", "subResources": ",".join(SUBS), "state": "row",
                        "replicas": "1", "replicasTimeout": "2", "txnAppId": name}

    def _write(self, id: str, seq: int) -> None:
        spark = self.spark
        # Spark finds data sources through the JVM thread's active session (a worker thread).
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
        rows = spark.createDataFrame([(id, seq)], "uuid string, seq long")
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


__all__ = ["SparkWriter", "session"]
