"""The executors' side of a write: changes committed straight to the bucket, in pipelined chunks.

Each task encodes its rows (`rows.RowEncoder`), cuts the changes into chunks of `batchSize` and
commits each chunk atomically with the bucket's idempotent commit (`Log.commit_stream`,
`pipeline` chunks in flight while the next one is encoded). A chunk's idempotency key names the
write, the micro-batch, the task and the chunk's content::

    spark:<writer>:<batch id>:<task>:<digest of the chunk's changes>:<n>

`<writer>` is the streaming query's name, `txn:<txnAppId>:<txnVersion>` for a batch job with
those options (the same for the job submitted again), or `job:<uuid>` (the batch id is then 0);
`<n>` counts the task's earlier chunks with the same digest, so identical chunks stay distinct.
With `sortRows` the task's changes are put in a canonical order before they are cut, so a retry
that gets its rows in another order (after a shuffle) cuts the same chunks.
The rows of a chunk are sorted by id (stably: one id's changes keep their order) before the
digest is taken. So whatever Spark runs again — a failed task, a speculative copy, a micro-batch
after a driver failure — sends the same chunks under the same keys, even when they come in
another order or with their rows in another order, and the bucket writes none of them twice: it
answers with their original cursors.

A streaming query also keeps a ledger of the micro-batches it committed,
``{name}:spark:<query>`` (batch id -> ``"<count> <first cursor> <last cursor> <figures>"``,
`progress.ledger_entry`, the last `RETAIN_BATCHES`): a task of a recorded micro-batch sends
nothing, even once the keys of its chunks were forgotten (the bucket keeps idempotency keys for
maxAge).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
import structlog
from pyspark.sql.datasource import WriterCommitMessage

from changefeed.errors import ReplicationTimeout
from publisher.bucket import (
    ChangeBucket,
    Committed,
    Encoded,
    EncodedBatch,
    StreamStats,
    open_bucket,
)
from publisher.spark.options import SinkOptions, Target
from publisher.spark.progress import Figures, ledger_entry
from publisher.spark.rows import RowEncoder, by_id, canonical, chunks

log = structlog.get_logger(__name__)

RETAIN_BATCHES = 1000
"""Micro-batch records kept per streaming query (Spark keeps 100 by default)."""


@dataclass(frozen=True, slots=True)
class Span:
    """Changes committed in one go: how many, and the cursors of the first and the last."""

    count: int = 0
    first: str | None = None
    last: str | None = None

    def __add__(self, other: Span) -> Span:
        """The changes of both, from the smaller first cursor to the greater last one."""
        if not other.count:
            return self
        if not self.count:
            return other
        return Span(
            self.count + other.count,
            min(self.first or "", other.first or ""),
            max(self.last or "", other.last or ""),
        )

    def __str__(self) -> str:
        return f"{self.count} changes ({self.first} .. {self.last})" if self.count else "nothing"

    @classmethod
    def of(cls, committed: Committed) -> Span:
        return cls(committed.count, committed.first_cursor, committed.last_cursor)


@dataclass(frozen=True, slots=True)
class TaskWritten(WriterCommitMessage):
    """What one task wrote: its commit message, pickled back to the driver."""

    task: int
    chunks: int
    written: Span
    """The task's changes as they are in the log, whichever attempt committed them."""
    skipped: int
    """Changes that an earlier attempt had already committed (not written again)."""
    chunks_skipped: int = 0
    """Chunks found already committed (by their idempotency keys) and not written again."""
    redis_seconds: float = 0.0
    """Time the task waited for Redis (sending and answers)."""


def chunk_key(writer: str, batch_id: int, task: int, digest: str, occurrence: int) -> str:
    """The idempotency key of a chunk (see the module's docstring)."""
    return f"spark:{writer}:{batch_id}:{task}:{digest}:{occurrence}"


def keyed_chunks(
    chunked: Iterator[list[Encoded]], writer: str, batch_id: int, task: int
) -> Iterator[EncodedBatch]:
    """Each chunk in a canonical order (by id, stably), with how its idempotency key is named
    from its digest."""
    seen: Counter[str] = Counter()

    def key_of(digest: str) -> str:
        occurrence = seen[digest]
        seen[digest] += 1
        return chunk_key(writer, batch_id, task, digest, occurrence)

    for chunk in chunked:
        yield by_id(chunk), key_of


def _bucket(target: Target) -> ChangeBucket:
    return open_bucket(target.redis_url, target.name, target.resources, target.partitions)


def write_task(
    batches: Iterator[pa.RecordBatch], options: SinkOptions, writer: str, batch_id: int, task: int
) -> TaskWritten:
    """Commit the changes of one task's rows; runs on an executor."""
    return asyncio.run(_write_task(batches, options, writer, batch_id, task))


def skip_task(batches: Iterator[pa.RecordBatch], task: int) -> TaskWritten:
    """A task of a write already committed: its rows are read (Spark sends them) and dropped."""
    return TaskWritten(task, 0, Span(), sum(batch.num_rows for batch in batches))


async def _write_task(
    batches: Iterator[pa.RecordBatch], options: SinkOptions, writer: str, batch_id: int, task: int
) -> TaskWritten:
    bucket = _bucket(options.target)
    done = TaskWritten(task, 0, Span(), 0)
    stats = StreamStats()
    try:
        if options.query is not None and await bucket.ledgers.batch_recorded(writer, batch_id):
            return skip_task(batches, task)
        encoder = RowEncoder(options, bucket.log.validate)
        changes: Iterable[Encoded] = (
            change for batch in batches for change in encoder.encode(batch)
        )
        if options.sort_rows:
            changes = canonical(changes)  # a bad row fails here, before anything is sent
        keyed = keyed_chunks(chunks(changes, options.batch_size), writer, batch_id, task)
        async for committed in bucket.log.commit_stream(keyed, options.pipeline, stats):
            done = _tally(done, committed)
        if options.replicas:
            await _replicated(bucket, options, done)
    except BaseException as exc:
        log.error(
            "spark write task failed", task=task, batch=batch_id, written=str(done.written),
            skipped=done.skipped, error=str(exc),
        )
        raise
    finally:
        await bucket.aclose()
    return replace(done, redis_seconds=round(stats.redis_seconds, 3))


async def _replicated(bucket: ChangeBucket, options: SinkOptions, done: TaskWritten) -> None:
    """Wait until `options.replicas` replicas have every change of the task (those it replayed
    too: a try before may have been written on the master only); raise ReplicationTimeout, and
    so fail the task (Spark tries it again: its chunks are committed under the same keys), when
    fewer confirm them within `options.replicas_timeout` seconds."""
    acknowledged = await bucket.wait_for_replicas(options.replicas, options.replicas_timeout)
    if acknowledged < options.replicas:
        raise ReplicationTimeout(
            f"spark write: written on the master, but only {acknowledged} of "
            f"{options.replicas} replica(s) confirmed it within {options.replicas_timeout} s",
            [], options.replicas, acknowledged,
        )


def _tally(done: TaskWritten, committed: Committed) -> TaskWritten:
    return TaskWritten(
        done.task,
        done.chunks + 1,
        done.written + Span.of(committed),
        done.skipped + (0 if committed.fresh else committed.count),
        done.chunks_skipped + (0 if committed.fresh else 1),
    )


def total(messages: Sequence[TaskWritten | None]) -> Span:
    """All the changes the tasks committed, with the first and the last cursor among them."""
    return sum((m.written for m in messages if m is not None), Span())


def skipped(messages: Sequence[TaskWritten | None]) -> int:
    """Changes the tasks found already committed (by an earlier attempt) and did not send."""
    return sum(m.skipped for m in messages if m is not None)


def figures(messages: Sequence[TaskWritten | None]) -> Figures:
    """The write's figures: changes and chunks written now, chunks and changes skipped as
    already committed, seconds the tasks waited for Redis."""
    found = [m for m in messages if m is not None]
    return Figures(
        changes_written=sum(m.written.count - m.skipped for m in found),
        chunks_written=sum(m.chunks - m.chunks_skipped for m in found),
        chunks_skipped=sum(m.chunks_skipped for m in found),
        changes_skipped=sum(m.skipped for m in found),
        redis_seconds=round(sum(m.redis_seconds for m in found), 3),
    )


def abort_report(messages: Sequence[TaskWritten | None]) -> dict[str, object]:
    """What a failed write did and did not commit, for the log line of its abort."""
    finished = [m for m in messages if m is not None]
    return {
        "written": str(total(messages)),
        "tasks_finished": len(finished),
        "tasks_failed": len(messages) - len(finished),
        "not_written": "the rows of the failed tasks after their last committed chunk "
        "(their executors logged what they committed)",
    }


async def finish_batch(
    options: SinkOptions, writer: str, batch_id: int, messages: Sequence[TaskWritten | None]
) -> Span:
    """Record micro-batch `batch_id` of streaming query `writer` as committed (once), with its
    figures, and forget the one RETAIN_BATCHES older; the ledger expires `record_retention`
    after its last batch. Returns what the micro-batch's tasks committed."""
    span = total(messages)
    entry = ledger_entry(span.count, span.first, span.last, figures(messages))
    bucket = _bucket(options.target)
    try:
        await bucket.ledgers.record_batch(
            writer, batch_id, entry, RETAIN_BATCHES, options.record_retention * 1000
        )
    finally:
        await bucket.aclose()
    return span


async def committed_version(options: SinkOptions) -> tuple[int, str] | None:
    """The newest version recorded for the job's txnAppId, with its record; None if none."""
    assert options.txn_app_id is not None
    bucket = _bucket(options.target)
    try:
        record = await bucket.ledgers.txn_record(options.txn_app_id)
    finally:
        await bucket.aclose()
    if record is None:
        return None
    version, _, summary = record.partition(" ")
    return int(version), summary


async def record_version(options: SinkOptions, span: Span) -> int:
    """Record the job's txnVersion as committed (for `record_retention`); returns the version
    that stands (a higher one, if another job recorded it meanwhile)."""
    assert options.txn_app_id is not None and options.txn_version is not None
    bucket = _bucket(options.target)
    try:
        record = await bucket.ledgers.record_txn(
            options.txn_app_id, options.txn_version, f"{span.count} {span.first} {span.last}",
            options.record_retention * 1000,
        )
    finally:
        await bucket.aclose()
    return int(record.partition(" ")[0])


async def ping(target: Target) -> None:
    """Raise BucketUnavailable unless the bucket's Redis answers."""
    bucket = _bucket(target)
    try:
        await bucket.log.ping(f"bucket {target.name!r} at {target.redis_url}")
    finally:
        await bucket.aclose()
