"""Reading the bucket into Spark: ranges of the change log (or resources of the store) planned on
the driver, read by executors.

A range is (after, until] in one epoch of the bucket; the executors read it page by page with
the publisher's `ChangeBucket.read` (and, with includeState, each page's current states with one
HMGET per resource). A batch read is bounded when it is planned: by endingCursor or
endingTimestamp, else by the head at that moment. Streaming offsets are `{"cursor": "<cursor>"}`:
the last item a micro-batch includes, so a restarted query goes on from its checkpoint with
nothing lost and nothing read twice.

The store (`table=store`) is read one resource per partition, page by page in id order with
`ChangeBucket.page`: each page is consistent, the whole read is not a snapshot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from pyspark.sql.datasource import InputPartition

from changefeed.cursor import ZERO, AnyCursor, CompositeCursor, Cursor, StreamId, parse_cursor
from changefeed.errors import ChangefeedError, CursorError
from publisher.bucket import ChangeBucket, LogEntry, Retention, open_bucket
from publisher.bucket.cluster_url import is_cluster_url
from publisher.spark import cluster_log
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
    """Items after `after` up to `until` (inclusive) of the log of epoch `epoch`: of partition
    `partition` of `partitions` for a bucket in a Redis Cluster (None: the bucket's one log)."""

    def __init__(
        self, epoch: str, after: StreamId, until: StreamId, partition: int | None = None,
        partitions: int = 1,
    ) -> None:
        super().__init__((epoch, str(after), str(until), partition))
        self.epoch = epoch
        self.after = after
        self.until = until
        self.partition = partition
        self.partitions = partitions


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
    epoch: str, after: StreamId, until: StreamId, parts: int, partition: int | None = None,
    partitions: int = 1,
) -> list[LogRange]:
    """(after, until] cut into at most `parts` ranges of equal time."""
    if until <= after:
        return []
    span = until.ms - after.ms
    parts = max(1, min(parts, span))
    bounds = [StreamId(after.ms + span * k // parts, _LAST_SEQ) for k in range(1, parts)]
    starts = [after, *bounds]
    ends = [*bounds, until]
    return [LogRange(epoch, a, b, partition, partitions)
            for a, b in zip(starts, ends, strict=True)]


def ranges(first: AnyCursor, last: AnyCursor, parts: int) -> list[LogRange]:
    """The ranges of (first, last]: cut in time, and per partition for composite cursors (a
    bucket in a Redis Cluster), about `parts` in all."""
    if isinstance(first, CompositeCursor) and isinstance(last, CompositeCursor):
        n = len(first.positions)
        each = max(1, parts // n)
        return [
            r for p in range(n)
            for r in split(first.epoch, first.positions[p], last.positions[p], each, p, n)
        ]
    if isinstance(first, Cursor) and isinstance(last, Cursor):
        return split(first.epoch, first.position, last.position, parts)
    raise ChangefeedError(f"offsets of two kinds: {first} and {last}")


def _executor_bucket(target: Target) -> ChangeBucket:
    return open_bucket(target.redis_url, target.name, target.resources, target.partitions)


def read_range(
    target: Target, part: LogRange, include_state: bool = False
) -> Iterator[tuple[Any, ...]]:
    """The rows of the items in `part`, oldest first (executor side)."""
    owner = _executor_bucket(target)
    with asyncio.Runner() as runner:
        try:
            shard, _ = runner.run(owner.locate(part.partition or 0))
            after = part.after
            while True:
                entries = runner.run(shard.read(after, part.until, PAGE))
                states = runner.run(_states(owner, entries)) if include_state else None
                for n, entry in enumerate(entries):
                    cursor = (
                        Cursor(part.epoch, entry.position).encode() if part.partition is None
                        else CompositeCursor.at(
                            part.epoch, part.partitions, part.partition, entry.position
                        )
                    )
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
        found = await bucket.states(resource, [entries[n].changed_resource_id for n in rows])
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
    found = with_bucket(options.target, lambda bucket: bucket.stored_resources())
    return [StoreRange(resource) for resource in found]


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


def _start(options: SourceOptions, retention: Retention, epoch: str) -> StreamId:
    """The position a read starts after: startingCursor, startingTimestamp or earliest."""
    if options.start_ms is not None:
        ms = options.start_ms - 1
        return max(retention.trimmed, StreamId(ms, _LAST_SEQ) if ms >= 0 else ZERO)
    if options.start == "earliest":
        return retention.trimmed
    if options.start == "latest":
        return retention.head
    return position_in(retention, Cursor.decode(options.start), options.fail_on_data_loss)


def _end(options: SourceOptions, retention: Retention) -> StreamId | None:
    """The last position a read may include (endingCursor, endingTimestamp); None: no bound."""
    if options.end_ms is not None:
        return StreamId(max(options.end_ms, 0), _LAST_SEQ)
    if options.end is None or options.end == "latest":
        return None
    cursor = Cursor.decode(options.end)
    if retention.epoch is not None and cursor.epoch != retention.epoch:
        raise CursorError(
            cursor.encode(), f"of another bucket epoch than this bucket's {retention.epoch!r} "
            "(the bucket was recreated)",
        )
    return cursor.position


def starting_cursor(options: SourceOptions) -> AnyCursor:
    """The cursor a new stream starts after: earliest, latest, the one given or the time."""
    if is_cluster_url(options.target.redis_url):
        return with_bucket(
            options.target, lambda b: cluster_log.with_cluster(
                b, lambda c: cluster_log.starting_cursor(c, options))
        )

    async def start(bucket: ChangeBucket) -> Cursor:
        retention = await bucket.retention()
        epoch = retention.epoch or await bucket.ensure()
        if options.start not in ("earliest", "latest") and options.start_ms is None:
            cursor = Cursor.decode(options.start)
            position_in(retention, cursor, options.fail_on_data_loss)
            return cursor
        return Cursor(epoch, _start(options, retention, epoch))

    return with_bucket(options.target, start)


def plan_batch_read(options: SourceOptions) -> list[LogRange]:
    """The ranges of a batch read: from the start given (exclusive) to the end given
    (inclusive), or to the head when the read is planned."""
    if is_cluster_url(options.target.redis_url):
        bounds = with_bucket(
            options.target, lambda b: cluster_log.with_cluster(
                b, lambda c: cluster_log.batch_bounds(c, options))
        )
        return [] if bounds is None else ranges(*bounds, options.partitions)
    retention = with_bucket(options.target, lambda bucket: bucket.retention())
    if retention.epoch is None:
        return []
    after = _start(options, retention, retention.epoch)
    if options.start == "earliest" and options.start_ms is None:
        after = ZERO  # the whole retained log, even what a trim is removing meanwhile
    until = _end(options, retention)
    return split(retention.epoch, after, retention.head if until is None else until,
                 options.partitions)


def stream_bound(options: SourceOptions) -> StreamId | CompositeCursor | None:
    """Where a stream stops (endingCursor or endingTimestamp), or None."""
    if is_cluster_url(options.target.redis_url):
        return with_bucket(
            options.target, lambda b: cluster_log.with_cluster(
                b, lambda c: cluster_log.stream_bound(c, options))
        )
    retention = with_bucket(options.target, lambda bucket: bucket.retention())
    return _end(options, retention)


def head(options: SourceOptions) -> AnyCursor | None:
    """The bucket's head (None before it has an epoch): composite for a Redis Cluster."""
    async def head_of(bucket: ChangeBucket) -> AnyCursor | None:
        return await bucket.head_cursor()

    return with_bucket(options.target, head_of)


def latest(
    options: SourceOptions, start: AnyCursor, max_items: int | None,
    bound: StreamId | CompositeCursor | None = None,
) -> AnyCursor:
    """The end of the next micro-batch after `start`: the log's head, or `max_items` further,
    never past `bound`."""
    if isinstance(start, CompositeCursor):
        assert bound is None or isinstance(bound, CompositeCursor)
        return with_bucket(
            options.target, lambda b: cluster_log.with_cluster(
                b, lambda c: cluster_log.latest(c, options, start, max_items, bound))
        )
    assert not isinstance(bound, CompositeCursor)

    async def end_of(bucket: ChangeBucket) -> Cursor:
        retention = await bucket.retention()
        after = position_in(retention, start, options.fail_on_data_loss)
        last = retention.head if bound is None else min(retention.head, bound)
        if last <= after:
            return Cursor(start.epoch, after)
        if max_items is None:
            return Cursor(start.epoch, last)
        entries = await bucket.read(after, last, max_items)
        return Cursor(start.epoch, entries[-1].position if entries else after)

    return with_bucket(options.target, end_of)


def bounded(
    bound: StreamId | CompositeCursor | None, head: AnyCursor
) -> StreamId | CompositeCursor:
    """The nearer of a stream's bound and the head (each partition's, for composite ones)."""
    if isinstance(head, CompositeCursor):
        if not isinstance(bound, CompositeCursor):
            return head
        return CompositeCursor(head.epoch, tuple(
            min(a, b) for a, b in zip(head.positions, bound.positions, strict=True)
        ))
    if isinstance(bound, CompositeCursor):
        raise ChangefeedError(f"a composite bound {bound} for a single log's head {head}")
    return head.position if bound is None else min(bound, head.position)


def offset(cursor: AnyCursor) -> dict[str, str]:
    return {"cursor": cursor.encode()}


def cursor_of(offset: dict[str, Any]) -> AnyCursor:
    try:
        return parse_cursor(offset["cursor"])
    except (KeyError, TypeError):
        raise ChangefeedError(f"not an offset of the changefeed source: {offset!r}") from None
