"""Reading the change log into Spark: ranges of cursors planned on the driver, read by executors.

A range is (after, until] in one epoch of the bucket; the executors read it page by page with
the publisher's `ChangeBucket.read`. Streaming offsets are `{"cursor": "<cursor>"}`: the last item
a micro-batch includes, so a restarted query goes on from its checkpoint with nothing lost and
nothing read twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar

from pyspark.sql.datasource import InputPartition

from changefeed.cursor import ZERO, Cursor, StreamId
from changefeed.errors import ChangefeedError, CursorError
from publisher.bucket import ChangeBucket, Retention, connect
from publisher.spark.options import SourceOptions, Target

T = TypeVar("T")

SCHEMA = (
    "cursor string, published timestamp, resource string, subResources array<string>, id string"
)
PAGE = 10_000
"""Items per XRANGE when an executor reads a range."""
_LAST_SEQ = 2**64 - 1


class LogRange(InputPartition):
    """Items after `after` up to `until` (inclusive) of the log of epoch `epoch`."""

    def __init__(self, epoch: str, after: StreamId, until: StreamId) -> None:
        super().__init__((epoch, str(after), str(until)))
        self.epoch = epoch
        self.after = after
        self.until = until


def with_bucket(target: Target, use: Callable[[ChangeBucket], Awaitable[T]]) -> T:
    """Run `use` on a ChangeBucket of `target` (driver side), closing its client after."""

    async def run() -> T:
        bucket = ChangeBucket(
            connect(target.redis_url), target.name, target.resources, target.partitions
        )
        try:
            return await use(bucket)
        finally:
            await bucket.aclose()

    return asyncio.run(run())


def split(epoch: str, after: StreamId, until: StreamId, parts: int) -> list[LogRange]:
    """(after, until] cut into at most `parts` ranges of equal time."""
    if until <= after:
        return []
    span = until.ms - after.ms
    parts = max(1, min(parts, span))
    bounds = [StreamId(after.ms + span * k // parts, _LAST_SEQ) for k in range(1, parts)]
    starts = [after, *bounds]
    ends = [*bounds, until]
    return [LogRange(epoch, a, b) for a, b in zip(starts, ends, strict=True)]


def read_range(target: Target, part: LogRange) -> Iterator[tuple[Any, ...]]:
    """The rows of the items in `part`, oldest first (executor side)."""
    bucket = ChangeBucket(
        connect(target.redis_url), target.name, target.resources, target.partitions
    )
    with asyncio.Runner() as runner:
        try:
            after = part.after
            while True:
                entries = runner.run(bucket.read(after, part.until, PAGE))
                for entry in entries:
                    yield (
                        Cursor(part.epoch, entry.position).encode(),
                        datetime.fromtimestamp(entry.position.ms / 1000, tz=UTC),
                        entry.resource,
                        list(entry.sub_resources),
                        entry.changed_resource_id,
                    )
                if len(entries) < PAGE:
                    return
                after = entries[-1].position
        finally:
            runner.run(bucket.aclose())


def position_in(retention: Retention, cursor: Cursor, fail_on_data_loss: bool) -> StreamId:
    """Where `cursor` is in the retained log; CursorError when it cannot be resumed from."""
    if retention.epoch is not None and cursor.epoch != retention.epoch:
        raise CursorError(
            cursor.encode(), f"of another bucket epoch than this bucket's {retention.epoch!r} "
            "(the bucket was recreated): start again without the checkpoint",
        )
    if fail_on_data_loss and cursor.position < retention.trimmed:
        raise CursorError(
            cursor.encode(), "older than the retained log (items after it were trimmed by maxAge); "
            "set failOnDataLoss=false to go on from the oldest retained item",
        )
    return max(cursor.position, retention.trimmed)


def starting_cursor(options: SourceOptions) -> Cursor:
    """The cursor a new read starts after: earliest, latest or the one given."""

    async def start(bucket: ChangeBucket) -> Cursor:
        retention = await bucket.retention()
        epoch = retention.epoch or await bucket.ensure()
        if options.start == "earliest":
            return Cursor(epoch, retention.trimmed)
        if options.start == "latest":
            return Cursor(epoch, retention.head)
        cursor = Cursor.decode(options.start)
        position_in(retention, cursor, options.fail_on_data_loss)
        return cursor

    return with_bucket(options.target, start)


def plan_batch_read(options: SourceOptions) -> list[LogRange]:
    """The ranges of a batch read: everything retained after the starting cursor."""
    retention = with_bucket(options.target, lambda bucket: bucket.retention())
    if retention.epoch is None:
        return []
    after = ZERO
    if options.start == "latest":
        after = retention.head
    elif options.start != "earliest":
        after = position_in(retention, Cursor.decode(options.start), options.fail_on_data_loss)
    return split(retention.epoch, after, retention.head, options.partitions)


def latest(options: SourceOptions, start: Cursor, max_items: int | None) -> Cursor:
    """The end of the next micro-batch after `start`: the log's head, or `max_items` further."""

    async def head(bucket: ChangeBucket) -> Cursor:
        retention = await bucket.retention()
        after = position_in(retention, start, options.fail_on_data_loss)
        if max_items is None:
            end = max(after, retention.head)
        else:
            entries = await bucket.read(after, None, max_items)
            end = entries[-1].position if entries else after
        return Cursor(start.epoch, end)

    return with_bucket(options.target, head)


def offset(cursor: Cursor) -> dict[str, str]:
    return {"cursor": cursor.encode()}


def cursor_of(offset: dict[str, Any]) -> Cursor:
    try:
        return Cursor.decode(offset["cursor"])
    except (KeyError, TypeError):
        raise ChangefeedError(f"not an offset of the changefeed source: {offset!r}") from None
