"""The executors' side of a write: changes committed straight to the bucket, in pipelined batches.

Each task cuts its changes into chunks of `batchSize` and sends each chunk as one call of
`RECORDED_COMMIT_LUA`: the publisher's own `COMMIT_LUA` (state and change item, atomically),
wrapped in a check of the write's *record*, a Redis hash that says which chunks are already in
the log::

    {name}:spark:<query>      one per streaming query, kept across micro-batches
    {name}:spark:job:<id>     one per batch job, deleted when the job ends
        <batch id>                    "<count> <first cursor> <last cursor>" once the driver
                                      committed the micro-batch (the batch job's id is 0)
        <batch id>:<task>:<chunk>     "<epoch> <first id> <last id> <count>" once the chunk is in

Check and commit run in one script, so a chunk is in the log at most once whatever Spark retries:
a failed task, a micro-batch run again after a driver failure, a speculative copy. This relies on
what Spark's exactly-once sinks rely on: a micro-batch run again has the same rows in the same
partitions in the same order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import structlog
from pyspark.sql.datasource import WriterCommitMessage
from redis.asyncio.client import Pipeline

from changefeed.cursor import Cursor, StreamId
from publisher.bucket import COMMIT_LUA, ChangeBucket, connect, translate_redis_errors
from publisher.spark.options import SinkOptions, Target
from publisher.spark.rows import changes_of, chunks

log = structlog.get_logger(__name__)

RETAIN_BATCHES = 1000
"""Micro-batch records kept per streaming query (Spark keeps 100 by default)."""

# KEYS: COMMIT_LUA's keys, then the record. ARGV: COMMIT_LUA's arguments, then the batch field and
# the chunk field. Returns {1, summary} when the chunk was committed now, {0, ''} when it was
# already (the batch or the chunk is in the record). The summary is "<epoch> <first> <last> <n>".
RECORDED_COMMIT_LUA = f"""
local record, batch, chunk = KEYS[#KEYS], ARGV[#ARGV - 1], ARGV[#ARGV]
if redis.call('HEXISTS', record, batch) == 1 or redis.call('HEXISTS', record, chunk) == 1 then
  return {{0, ''}}
end
table.remove(KEYS)
table.remove(ARGV)
table.remove(ARGV)
local out = (function()
{COMMIT_LUA}
end)()
if out.err then return out end
local first = string.format('%d-%d', out[2], out[3])
local last = string.format('%d-%d', out[2], out[3] + out[4] - 1)
local summary = out[1] .. ' ' .. first .. ' ' .. last .. ' ' .. out[4]
redis.call('HSET', record, chunk, summary)
return {{1, summary}}
"""


def record_key(bucket: str, query: str) -> str:
    """The record of a streaming query (or, as `job:<id>`, of a batch job), in the bucket's slot."""
    return "{" + bucket + "}:spark:" + query


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
    def parse(cls, summary: str) -> Span:
        epoch, first, last, count = summary.split()
        return cls(
            int(count),
            Cursor(epoch, StreamId.parse(first)).encode(),
            Cursor(epoch, StreamId.parse(last)).encode(),
        )


@dataclass(frozen=True, slots=True)
class TaskWritten(WriterCommitMessage):
    """What one task wrote: its commit message, pickled back to the driver."""

    task: int
    chunks: int
    written: Span
    skipped: int
    """Changes of chunks that an earlier attempt had already committed."""


def write_task(
    batches: Iterator[pa.RecordBatch], options: SinkOptions, record: str, batch_id: int, task: int
) -> TaskWritten:
    """Commit the changes of one task's rows; runs on an executor."""
    return asyncio.run(_write_task(batches, options, record, batch_id, task))


async def _write_task(
    batches: Iterator[pa.RecordBatch], options: SinkOptions, record: str, batch_id: int, task: int
) -> TaskWritten:
    target = options.target
    bucket = ChangeBucket(
        connect(target.redis_url), target.name, target.resources, target.partitions
    )
    sent: list[int] = []  # sizes of the chunks in the pipeline
    done = TaskWritten(task, 0, Span(), 0)
    try:
        async with translate_redis_errors("spark write"):
            sha = await bucket.redis.script_load(RECORDED_COMMIT_LUA)
        pipe = bucket.redis.pipeline(transaction=False)
        changes = (changes_of(batch, options) for batch in batches)
        for number, chunk in enumerate(chunks(changes, options.batch_size)):
            keys, args = bucket.commit_arguments(chunk)
            fields = [str(batch_id), f"{batch_id}:{task}:{number}"]
            pipe.evalsha(sha, len(keys) + 1, *keys, record, *args, *fields)
            sent.append(len(chunk))
            if len(sent) >= options.pipeline:
                done = _tally(done, sent, await _execute(pipe))
                sent = []
        if sent:
            done = _tally(done, sent, await _execute(pipe))
    except BaseException as exc:
        log.error(
            "spark write task failed", task=task, batch=batch_id, written=str(done.written),
            skipped=done.skipped, error=str(exc),
        )
        raise
    finally:
        await bucket.aclose()
    return done


async def _execute(pipe: Pipeline) -> list[list[bytes]]:
    async with translate_redis_errors("spark write"):
        replies: list[list[bytes]] = await pipe.execute()
    return replies


def _tally(done: TaskWritten, sizes: Sequence[int], replies: list[list[bytes]]) -> TaskWritten:
    written, skipped = done.written, done.skipped
    for size, (fresh, summary) in zip(sizes, replies, strict=True):
        if fresh:
            written = written + Span.parse(summary.decode())
        else:
            skipped += size
    return TaskWritten(done.task, done.chunks + len(sizes), written, skipped)


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
    target: Target, record: str, batch_id: int, messages: Sequence[TaskWritten | None]
) -> Span:
    """Record micro-batch `batch_id` as committed (once) and forget its chunks and old batches.

    Returns what the micro-batch committed, over all the attempts of its tasks.
    """
    chunk_fields = [
        f"{batch_id}:{m.task}:{number}" for m in messages if m for number in range(m.chunks)
    ]
    client = connect(target.redis_url)
    try:
        async with translate_redis_errors("spark commit"):
            summaries = await client.hmget(record, chunk_fields) if chunk_fields else []
            span = Span()
            for summary in summaries:
                if isinstance(summary, bytes):
                    span = span + Span.parse(summary.decode())
            async with client.pipeline(transaction=True) as pipe:
                pipe.hsetnx(record, str(batch_id), f"{span.count} {span.first} {span.last}")
                if chunk_fields:
                    pipe.hdel(record, *chunk_fields)
                if batch_id >= RETAIN_BATCHES:
                    pipe.hdel(record, str(batch_id - RETAIN_BATCHES))
                await pipe.execute()
    finally:
        await client.aclose()
    return span


async def forget(target: Target, record: str) -> None:
    """Delete the record of a batch job that ended."""
    client = connect(target.redis_url)
    try:
        async with translate_redis_errors("spark commit"):
            await client.delete(record)
    finally:
        await client.aclose()


async def ping(target: Target) -> None:
    """Raise BucketUnavailable unless the bucket's Redis answers."""
    client = connect(target.redis_url)
    try:
        async with translate_redis_errors(f"bucket {target.name!r} at {target.redis_url}"):
            await client.ping()
    finally:
        await client.aclose()
