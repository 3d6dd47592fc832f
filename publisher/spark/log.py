"""Reading the bucket into Spark: ranges of the change log (or resources of the store) planned on
the driver, read by executors.

A range is (after, until] of one shard of the bucket in one epoch (an ordered bucket has one
shard; a bucket in a Redis Cluster one per partition, each cut into ranges of its own); the
executors read it page by page with the shard's `read` (and, with includeState, each page's
current states with one HMGET per resource). A batch read is bounded when it is planned: by
endingCursor or endingTimestamp, else by the head at that moment. Streaming offsets are
`{"cursor": "<cursor>"}` (each shard's position: composite for a bucket in a Redis Cluster): the
last item a micro-batch includes, so a restarted query goes on from its checkpoint with nothing
lost and nothing read twice.

The store (`table=store`) is read one resource per partition, page by page in id order with
`ChangeBucket.page`: each page is consistent, the whole read is not a snapshot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from pyspark.sql.datasource import InputPartition

from changefeed.cursor import ZERO, Position, StreamId
from changefeed.errors import ChangefeedError, CursorError
from publisher.bucket import (
    ChangeBucket,
    LogEntry,
    Retention,
    Vector,
    decode_vector,
    merge_partitions,
    open_bucket,
)
from publisher.spark.options import Options, SourceOptions, Target

T = TypeVar("T")

SCHEMA = (
    "cursor string, published timestamp, resource string, subResources array<string>, id string"
)
STATE_SCHEMA = SCHEMA + ", state string"
"""With includeState: each change's current state in the store (JSON text, null if none)."""
STORE_SCHEMA = "resource string, id string, state string"
"""table=store: every stored state, as JSON text."""
PAGE = 10_000
"""Items per XRANGE when an executor reads a range."""
_LAST_SEQ = 2**64 - 1


class LogRange(InputPartition):
    """Items after `after` up to `until` (inclusive) of shard `shard` of the log of epoch
    `epoch` (`shards` in all; `composite`: a bucket in a Redis Cluster, whose rows' cursors are
    composite: the bucket's vector with only this shard's position)."""

    def __init__(
        self, epoch: str, after: StreamId, until: StreamId, shard: int = 0, shards: int = 1,
        composite: bool = False,
    ) -> None:
        super().__init__((epoch, str(after), str(until), shard))
        self.epoch = epoch
        self.after = after
        self.until = until
        self.shard = shard
        self.shards = shards
        self.composite = composite

    def cursor(self, position: StreamId) -> str:
        """The cursor of the row at `position`."""
        return Vector.zero(self.epoch, self.shards, self.composite).advanced(
            self.shard, position).encode()


class StoreRange(InputPartition):
    """Every stored state of `resource`."""

    def __init__(self, resource: str) -> None:
        super().__init__(resource)
        self.resource = resource


def schema_of_options(options: Mapping[str, str]) -> str:
    """The schema a read with `options` gives: the log's, with `state` under includeState, or
    the store's under table=store."""
    opts = Options(options)
    if opts.get("table") == "store":
        return STORE_SCHEMA
    return STATE_SCHEMA if (opts.get("includeState") or "").lower() == "true" else SCHEMA


def with_bucket(target: Target, use: Callable[[ChangeBucket], Awaitable[T]]) -> T:
    """Run `use` on a ChangeBucket of `target` (driver side), closing its client after."""

    async def run() -> T:
        bucket = open_bucket(target.redis_url, target.name, target.resources, target.partitions)
        try:
            return await use(bucket)
        finally:
            await bucket.aclose()

    return asyncio.run(run())


def split(
    epoch: str, after: StreamId, until: StreamId, parts: int, shard: int = 0, shards: int = 1,
    composite: bool = False,
) -> list[LogRange]:
    """(after, until] cut into at most `parts` ranges of equal time."""
    if until <= after:
        return []
    span = until.ms - after.ms
    parts = max(1, min(parts, span))
    bounds = [StreamId(after.ms + span * k // parts, _LAST_SEQ) for k in range(1, parts)]
    starts = [after, *bounds]
    ends = [*bounds, until]
    return [LogRange(epoch, a, b, shard, shards, composite)
            for a, b in zip(starts, ends, strict=True)]


def ranges(first: Vector, last: Vector, parts: int) -> list[LogRange]:
    """The ranges of (first, last]: cut in time, and per shard (one per partition of a bucket
    in a Redis Cluster), about `parts` in all."""
    if first.composite != last.composite or len(first.positions) != len(last.positions):
        raise ChangefeedError(f"offsets of two kinds: {first} and {last}")
    n = len(first.positions)
    each = max(1, parts // n)
    return [
        r for s in range(n)
        for r in split(first.epoch, first.positions[s], last.positions[s], each, s, n,
                       first.composite)
    ]


def _executor_bucket(target: Target) -> ChangeBucket:
    return open_bucket(target.redis_url, target.name, target.resources, target.partitions)


def read_range(
    target: Target, part: LogRange, include_state: bool = False
) -> Iterator[tuple[Any, ...]]:
    """The rows of the items in `part`, oldest first (executor side)."""
    owner = _executor_bucket(target)
    with asyncio.Runner() as runner:
        try:
            shard = runner.run(owner.log.shards())[part.shard]
            after = part.after
            while True:
                entries = runner.run(shard.read(after, part.until, PAGE))
                states = runner.run(_states(owner, entries)) if include_state else None
                for n, entry in enumerate(entries):
                    cursor = part.cursor(entry.position)
                    row: tuple[Any, ...] = (
                        cursor,
                        datetime.fromtimestamp(entry.position.ms / 1000, tz=UTC),
                        entry.resource,
                        list(entry.sub_resources),
                        entry.changed_resource_id,
                    )
                    yield row if states is None else (*row, states[n])
                if len(entries) < PAGE:
                    return
                after = entries[-1].position
        finally:
            runner.run(owner.aclose())


async def _states(bucket: ChangeBucket, entries: list[LogEntry]) -> list[str | None]:
    """The current stored state of each entry's resource object (JSON text, or None)."""
    by_resource: dict[str, list[int]] = {}
    for n, entry in enumerate(entries):
        by_resource.setdefault(entry.resource, []).append(n)
    states: list[str | None] = [None] * len(entries)
    for resource, rows in by_resource.items():
        found = await bucket.log.states(resource, [entries[n].changed_resource_id for n in rows])
        for n, state in zip(rows, found, strict=True):
            states[n] = None if state is None else state.decode()
    return states


def read_store(target: Target, part: StoreRange) -> Iterator[tuple[Any, ...]]:
    """(resource, id, state) of every stored state of `part.resource`, in id order."""
    bucket = _executor_bucket(target)
    with asyncio.Runner() as runner:
        try:
            after: str | None = None
            while True:
                page = runner.run(bucket.page(part.resource, after, PAGE))
                for id, state in zip(page.ids, page.states, strict=True):
                    yield part.resource, id, None if state is None else bytes(state).decode()
                if len(page.ids) < PAGE:
                    return
                after = page.ids[-1]
        finally:
            runner.run(bucket.aclose())


def plan_store_read(options: SourceOptions) -> list[StoreRange]:
    """One partition per resource: those named, else every resource with a stored state."""
    if options.resources is not None:
        return [StoreRange(resource) for resource in options.resources]
    found = with_bucket(options.target, lambda bucket: bucket.log.stored_resources())
    return [StoreRange(resource) for resource in found]


def _vector(text: str, bucket: ChangeBucket, shards: int, epoch: str | None) -> Vector:
    """The cursor `text` of this bucket (of `epoch`, when known); CursorError otherwise."""
    cursor = decode_vector(text, shards, not bucket.log.ordered)
    if epoch is not None and cursor.epoch != epoch:
        raise CursorError(
            text, f"of another bucket epoch than this bucket's {epoch!r} (the bucket was "
            "recreated): start again without the checkpoint",
        )
    return cursor


def resumable(
    cursor: Vector, retentions: list[Retention], fail_on_data_loss: bool
) -> tuple[StreamId, ...]:
    """Each shard's position to go on after; CursorError when one was trimmed past."""
    out = []
    for at, retention in zip(cursor.positions, retentions, strict=True):
        if fail_on_data_loss and at < retention.trimmed:
            raise CursorError(
                cursor.encode(), "older than the retained log (items after it were trimmed by "
                "maxAge); set failOnDataLoss=false to go on from the oldest retained item",
            )
        out.append(max(at, retention.trimmed))
    return tuple(out)


def _starts(
    options: SourceOptions, bucket: ChangeBucket, retentions: list[Retention], epoch: str
) -> tuple[StreamId, ...]:
    """Each shard's position a read starts after: startingCursor, startingTimestamp or
    earliest."""
    if options.start_ms is not None:
        ms = options.start_ms - 1
        at = StreamId(ms, _LAST_SEQ) if ms >= 0 else ZERO
        return tuple(max(r.trimmed, at) for r in retentions)
    if options.start == "earliest":
        return tuple(r.trimmed for r in retentions)
    if options.start == "latest":
        return tuple(r.head for r in retentions)
    cursor = _vector(options.start, bucket, len(retentions), epoch)
    return resumable(cursor, retentions, options.fail_on_data_loss)


def _ends(
    options: SourceOptions, bucket: ChangeBucket, retentions: list[Retention], epoch: str
) -> tuple[StreamId, ...] | None:
    """Each shard's last position a read may include (endingCursor, endingTimestamp); None:
    no bound."""
    if options.end_ms is not None:
        return (StreamId(max(options.end_ms, 0), _LAST_SEQ),) * len(retentions)
    if options.end is None or options.end == "latest":
        return None
    return _vector(options.end, bucket, len(retentions), epoch).positions


async def _epoch(bucket: ChangeBucket) -> str:
    return await bucket.log.current_epoch() or await bucket.log.ensure()


def starting_cursor(options: SourceOptions) -> Vector:
    """The cursor a new stream starts after: earliest, latest, the one given or the time."""

    async def start(bucket: ChangeBucket) -> Vector:
        epoch = await _epoch(bucket)
        retentions = await bucket.log.retentions()
        positions = _starts(options, bucket, retentions, epoch)
        if options.start not in ("earliest", "latest") and options.start_ms is None:
            return _vector(options.start, bucket, len(retentions), epoch)  # as given
        return bucket.log.vector(epoch, positions)

    return with_bucket(options.target, start)


def plan_batch_read(options: SourceOptions) -> list[LogRange]:
    """The ranges of a batch read: from the start given (exclusive) to the end given
    (inclusive), or to the head when the read is planned."""

    async def bounds(bucket: ChangeBucket) -> tuple[Vector, Vector] | None:
        epoch = await bucket.log.current_epoch()
        if epoch is None:
            return None
        retentions = await bucket.log.retentions()
        after = _starts(options, bucket, retentions, epoch)
        if options.start == "earliest" and options.start_ms is None:
            after = (ZERO,) * len(retentions)  # the whole retained log, even what a trim is
            # removing meanwhile
        until = _ends(options, bucket, retentions, epoch) or tuple(r.head for r in retentions)
        return bucket.log.vector(epoch, after), bucket.log.vector(epoch, until)

    found = with_bucket(options.target, bounds)
    return [] if found is None else ranges(*found, options.partitions)


def stream_bound(options: SourceOptions) -> Vector | None:
    """Where a stream stops (endingCursor or endingTimestamp), or None."""

    async def bound(bucket: ChangeBucket) -> Vector | None:
        epoch = await _epoch(bucket)
        ends = _ends(options, bucket, await bucket.log.retentions(), epoch)
        return None if ends is None else bucket.log.vector(epoch, ends)

    return with_bucket(options.target, bound)


def head(options: SourceOptions) -> Vector | None:
    """The bucket's head (None before it has an epoch): each shard's."""

    async def head_of(bucket: ChangeBucket) -> Vector | None:
        return await bucket.log.head()

    return with_bucket(options.target, head_of)


def latest(
    options: SourceOptions, start: Vector, max_items: int | None, bound: Vector | None = None,
) -> Vector:
    """The end of the next micro-batch after `start`: each shard's head, or `max_items`
    further in all (merged by stream id), never past `bound`."""

    async def end_of(bucket: ChangeBucket) -> Vector:
        retentions = await bucket.log.retentions()
        epoch = retentions[0].epoch
        _vector(start.encode(), bucket, len(retentions), epoch)
        after = resumable(start, retentions, options.fail_on_data_loss)
        last = tuple(
            r.head if bound is None else min(r.head, bound.positions[s])
            for s, r in enumerate(retentions)
        )
        if max_items is None:
            return start.with_positions([max(a, b) for a, b in zip(after, last, strict=True)])
        shards = await bucket.log.shards()
        reads = [await shard.read(after[s], last[s], max_items) if last[s] > after[s] else []
                 for s, shard in enumerate(shards)]
        shard_of = {id(e): s for s, entries in enumerate(reads) for e in entries}
        vector = start.with_positions(after)
        merged = reads[0] if len(reads) == 1 else merge_partitions(reads, max_items)
        for entry in merged:
            vector = vector.advanced(shard_of[id(entry)], entry.position)
        return vector

    return with_bucket(options.target, end_of)


def bounded(bound: Vector | None, head: Vector) -> Vector:
    """The nearer of a stream's bound and the head (each shard's)."""
    if bound is None:
        return head
    if bound.composite != head.composite or len(bound.positions) != len(head.positions):
        raise ChangefeedError(f"a bound {bound} of another kind than the head {head}")
    return head.with_positions(
        [min(a, b) for a, b in zip(head.positions, bound.positions, strict=True)]
    )


def offset(cursor: Vector) -> dict[str, str]:
    return {"cursor": cursor.encode()}


def cursor_of(offset: dict[str, Any]) -> Vector:
    try:
        return Position.decode(offset["cursor"])
    except (KeyError, TypeError):
        raise ChangefeedError(f"not an offset of the changefeed source: {offset!r}") from None
