"""The `changefeed` data source: Spark's Python Data Source API over the bucket.

Thin: the Spark classes check their options on the driver (`options`), hand rows to the executors'
writer (`sink`) and ranges of the log to the executors' reader (`log`), record a job's txnVersion
once it committed, and log what a write did (or, failed, did and did not commit).

Needs PySpark 4.2 or later: `DataSourceStreamArrowWriter` (4.1), admission control
(`latestOffset(start, limit)`, `getDefaultReadLimit`, `reportLatestOffset`) and
`SupportsTriggerAvailableNow` (4.2).

    df.write.format("changefeed").mode("append").option("config", "config.js")
        .option("resource", "vm").option("subResources", "nic").save()
    spark.read.format("changefeed").option("config", "config.js").load()
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import structlog
from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from changefeed.errors import OptionError
from publisher.spark import log as changelog
from publisher.spark import sink
from publisher.spark.options import SinkOptions, SourceOptions, sink_options, source_options

logger = structlog.get_logger(__name__)


class ChangefeedDataSource(DataSource):
    """`format("changefeed")`: write rows as changes, read the change log as rows."""

    @classmethod
    def name(cls) -> str:
        return "changefeed"

    def schema(self) -> str:
        """The schema of a read (the options are checked by the reader)."""
        return changelog.schema_of_options(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> ChangefeedWriter:
        return ChangefeedWriter(_checked(self.options, schema, overwrite, streaming=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> ChangefeedStreamWriter:
        return ChangefeedStreamWriter(_checked(self.options, schema, overwrite, streaming=True))

    def reader(self, schema: StructType) -> ChangefeedReader:
        return ChangefeedReader(self.options)

    def streamReader(self, schema: StructType) -> ChangefeedStreamReader:
        return ChangefeedStreamReader(self.options)


def register(spark: SparkSession) -> None:
    """Make `format("changefeed")` available in `spark`.

    Not needed where the `pyspark_changefeed` module is importable by the Python that Spark
    starts (PYSPARK_PYTHON): Spark registers it in every session (docs/spark.md).
    """
    spark.dataSource.register(ChangefeedDataSource)


def _checked(
    options: Mapping[str, str], schema: StructType, overwrite: bool, streaming: bool
) -> SinkOptions:
    """Every option checked, and the bucket's Redis reached, before any task runs."""
    if overwrite:
        raise OptionError("mode", "overwrite", "append: a change feed only grows")
    checked = sink_options(options, schema, streaming)
    asyncio.run(sink.ping(checked.target))
    return checked


def _task_id() -> int:
    context = TaskContext.get()
    return context.partitionId() if context else 0


def _write(
    options: SinkOptions, writer: str, batch_id: int, batches: Iterator[pa.RecordBatch]
) -> sink.TaskWritten:
    return sink.write_task(batches, options, writer, batch_id, _task_id())


def _messages(messages: Sequence[WriterCommitMessage | None]) -> list[sink.TaskWritten | None]:
    return [m if isinstance(m, sink.TaskWritten) else None for m in messages]


class ChangefeedWriter(DataSourceArrowWriter):
    """A batch write: each task commits its rows; retried tasks publish nothing twice.

    With txnAppId and txnVersion, a version already committed for the app id is skipped (its
    tasks send nothing), and a version committed is recorded when every task has succeeded.
    """

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.skip: tuple[int, str] | None = None
        """The version recorded for txnAppId when it is >= txnVersion: this write is skipped."""
        if options.txn_app_id is not None:
            self.writer = f"txn:{options.txn_app_id}:{options.txn_version}"
            """Names the job in its chunks' idempotency keys: the same for a job submitted
            again with the same txnVersion, so its chunks already in are not written again."""
            found = asyncio.run(sink.committed_version(options))
            version = options.txn_version
            if found is not None and version is not None and found[0] >= version:
                self.skip = found
        else:
            self.writer = f"job:{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> sink.TaskWritten:
        if self.skip is not None:
            return sink.skip_task(iterator, _task_id())
        return _write(self.options, self.writer, 0, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        found = _messages(messages)
        options = self.options
        if self.skip is not None:
            logger.info(
                "spark write skipped", resource=options.resource, txn_app_id=options.txn_app_id,
                txn_version=options.txn_version, committed_version=self.skip[0],
                committed=self.skip[1], reason="txnVersion already committed for txnAppId",
            )
            return
        span = sink.total(found)
        extra: dict[str, object] = {}
        if options.txn_app_id is not None:
            extra = {"txn_app_id": options.txn_app_id, "txn_version": options.txn_version,
                     "recorded_version": asyncio.run(sink.record_version(options, span))}
        logger.info(
            "spark write committed", resource=options.resource, written=str(span),
            retried=sink.skipped(found), **sink.figures(found).log_fields(), **extra,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        logger.error(
            "spark write aborted", resource=self.options.resource,
            **sink.abort_report(_messages(messages)),
        )


class ChangefeedStreamWriter(DataSourceStreamArrowWriter):
    """A streaming write: one commit per micro-batch, recorded under the query's name."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        assert options.query is not None
        self.writer = options.query

    def write(self, iterator: Iterator[pa.RecordBatch]) -> sink.TaskWritten:
        context = TaskContext.get()
        batch_id = int(context.getLocalProperty("streaming.sql.batchId") or -1) if context else -1
        if batch_id < 0:
            raise RuntimeError("a streaming write task without a micro-batch id")
        return _write(self.options, self.writer, batch_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        found = _messages(messages)
        span = asyncio.run(sink.finish_batch(self.options, self.writer, batchId, found))
        logger.info(
            "spark micro-batch committed", resource=self.options.resource, batch=batchId,
            query=self.options.query, written=str(span), retried=sink.skipped(found),
            **sink.figures(found).log_fields(),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        logger.error(
            "spark micro-batch aborted", resource=self.options.resource, batch=batchId,
            query=self.options.query, **sink.abort_report(_messages(messages)),
        )


class ChangefeedReader(DataSourceReader):
    """A batch read of the change log (bounded when planned), or of the store."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = source_options(options)

    def partitions(self) -> Sequence[InputPartition]:
        if self.options.table == "store":
            return changelog.plan_store_read(self.options)
        return changelog.plan_batch_read(self.options)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if isinstance(partition, changelog.StoreRange):
            return changelog.read_store(self.options.target, partition)
        if not isinstance(partition, changelog.LogRange):
            return iter(())  # Spark reads one InputPartition(None) when none were planned
        return changelog.read_range(self.options.target, partition, self.options.include_state)


class ChangefeedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The change log as a stream; offsets are cursors, checkpointed by Spark.

    Honours maxItemsPerTrigger under every trigger (Trigger.AvailableNow included: the items
    there when the query starts, in micro-batches of at most that many), stops at endingCursor
    or endingTimestamp, and reports the head as the latest offset (the query's lag).
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options: SourceOptions = source_options(options, streaming=True)
        self.bound = changelog.stream_bound(self.options)

    def initialOffset(self) -> dict[str, str]:
        return changelog.offset(changelog.starting_cursor(self.options))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_items_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        head = changelog.head(self.options)
        if head is not None:
            self.bound = changelog.bounded(self.bound, head)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, str]:
        max_items = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        cursor = changelog.cursor_of(start)
        return changelog.offset(changelog.latest(self.options, cursor, max_items, self.bound))

    def reportLatestOffset(self) -> dict[str, str] | None:
        head = changelog.head(self.options)
        return None if head is None else changelog.offset(head)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, last = changelog.cursor_of(start), changelog.cursor_of(end)
        return changelog.ranges(first, last, self.options.partitions)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, changelog.LogRange)
        return changelog.read_range(self.options.target, partition, self.options.include_state)
