"""The executors' side of a write: changes committed straight to the bucket, in pipelined chunks.

Each task cuts its changes into chunks of `batchSize` and commits each chunk atomically with the
bucket's idempotent commit (`ChangeBucket.commit_batches`, `pipeline` chunks per round trip).
A chunk's idempotency key names the write, the micro-batch, the task and the chunk's content::

    spark:<writer>:<batch id>:<task>:<digest of the chunk's changes>:<n>

`<writer>` is the streaming query's name, or `job:<uuid>` for a batch job (whose batch id is 0);
`<n>` counts the task's earlier chunks with the same digest, so identical chunks stay distinct.
The rows of a chunk are sorted by id (stably: one id's changes keep their order) before the
digest is taken. So whatever Spark runs again — a failed task, a speculative copy, a micro-batch
after a driver failure — sends the same chunks under the same keys, even when they come in
another order or with their rows in another order, and the bucket writes none of them twice: it
answers with their original cursors.

A streaming query also keeps a ledger of the micro-batches it committed,
``{name}:spark:<query>`` (batch id -> ``"<count> <first cursor> <last cursor>"``, the last
`RETAIN_BATCHES`): a task of a recorded micro-batch sends nothing, even once the keys of its
chunks were forgotten (the bucket keeps idempotency keys for maxAge).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import structlog
from pyspark.sql.datasource import WriterCommitMessage

from publisher.bucket import Batch, Change, ChangeBucket, Committed, connect, digest_of
from publisher.spark.options import SinkOptions, Target
from publisher.spark.rows import changes_of, chunks

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


def chunk_key(writer: str, batch_id: int, task: int, digest: str, occurrence: int) -> str:
    """The idempotency key of a chunk (see the module's docstring)."""
    return f"spark:{writer}:{batch_id}:{task}:{digest}:{occurrence}"


def keyed_chunks(
    chunked: Iterator[list[Change]], writer: str, batch_id: int, task: int
) -> Iterator[Batch]:
    """Each chunk in a canonical order (by id, stably), with its idempotency key."""
    seen: Counter[str] = Counter()
    for chunk in chunked:
        ordered = sorted(chunk, key=_id)
        digest = digest_of(ordered)
        yield ordered, chunk_key(writer, batch_id, task, digest, seen[digest])
        seen[digest] += 1


def _id(change: Change) -> str:
    return change.changed_resource_id


def _bucket(target: Target) -> ChangeBucket:
    return ChangeBucket(
        connect(target.redis_url), target.name, target.resources, target.partitions
    )


def write_task(
    batches: Iterator[pa.RecordBatch], options: SinkOptions, writer: str, batch_id: int, task: int
) -> TaskWritten:
    """Commit the changes of one task's rows; runs on an executor."""
    return asyncio.run(_write_task(batches, options, writer, batch_id, task))


async def _write_task(
    batches: Iterator[pa.RecordBatch], options: SinkOptions, writer: str, batch_id: int, task: int
) -> TaskWritten:
    bucket = _bucket(options.target)
    done = TaskWritten(task, 0, Span(), 0)
    try:
        if options.query is not None and await bucket.batch_recorded(writer, batch_id):
            return TaskWritten(task, 0, Span(), sum(batch.num_rows for batch in batches))
        changes = (changes_of(batch, options) for batch in batches)
        sending: list[Batch] = []
        for keyed in keyed_chunks(chunks(changes, options.batch_size), writer, batch_id, task):
            sending.append(keyed)
            if len(sending) >= options.pipeline:
                done = _tally(done, await bucket.commit_batches(sending))
                sending = []
        if sending:
            done = _tally(done, await bucket.commit_batches(sending))
    except BaseException as exc:
        log.error(
            "spark write task failed", task=task, batch=batch_id, written=str(done.written),
            skipped=done.skipped, error=str(exc),
        )
        raise
    finally:
        await bucket.aclose()
    return done


def _tally(done: TaskWritten, replies: Sequence[Committed]) -> TaskWritten:
    written, skipped = done.written, done.skipped
    for committed in replies:
        written = written + Span.of(committed)
        if not committed.fresh:
            skipped += committed.count
    return TaskWritten(done.task, done.chunks + len(replies), written, skipped)


def total(messages: Sequence[TaskWritten | None]) -> Span:
    """All the changes the tasks committed, with the first and the last cursor among them."""
    return sum((m.written for m in messages if m is not None), Span())


def skipped(messages: Sequence[TaskWritten | None]) -> int:
    """Changes the tasks found already committed (by an earlier attempt) and did not send."""
    return sum(m.skipped for m in messages if m is not None)


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
    target: Target, writer: str, batch_id: int, messages: Sequence[TaskWritten | None]
) -> Span:
    """Record micro-batch `batch_id` of streaming query `writer` as committed (once) and forget
    the one RETAIN_BATCHES older. Returns what the micro-batch's tasks committed."""
    span = total(messages)
    bucket = _bucket(target)
    try:
        await bucket.record_batch(
            writer, batch_id, f"{span.count} {span.first} {span.last}", RETAIN_BATCHES
        )
    finally:
        await bucket.aclose()
    return span


async def ping(target: Target) -> None:
    """Raise BucketUnavailable unless the bucket's Redis answers."""
    bucket = _bucket(target)
    try:
        await bucket.ping(f"bucket {target.name!r} at {target.redis_url}")
    finally:
        await bucket.aclose()
