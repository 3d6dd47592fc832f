"""Reading a bucket in a Redis Cluster into Spark: ranges per partition, composite offsets.

The partitions of a cluster bucket have logs of their own, so a read is planned per partition:
each partition's (after, until] is cut into ranges as a single log is (`log.split`), and the
executors read each range from its partition's log. A row's cursor is the composite cursor of
its one position (what a commit returns for it). Streaming offsets are `{"cursor": <composite
cursor>}`: each partition's position up to which the micro-batches have read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from changefeed.cursor import ZERO, CompositeCursor, StreamId, parse_cursor
from changefeed.errors import CursorError
from publisher.bucket import ChangeBucket as ClusterBucket
from publisher.bucket import Retention, merge_partitions
from publisher.spark.options import SourceOptions

T = TypeVar("T")
_LAST_SEQ = 2**64 - 1


def _composite(text: str, n: int, epoch: str | None) -> CompositeCursor:
    cursor = parse_cursor(text)
    if not isinstance(cursor, CompositeCursor) or len(cursor.positions) != n:
        raise CursorError(text, f"not a composite cursor of this bucket's {n} partition(s)")
    if epoch is not None and cursor.epoch != epoch:
        raise CursorError(text, f"of another bucket epoch than this bucket's {epoch!r} (the "
                          "bucket was recreated): start again without the checkpoint")
    return cursor


def resumable(cursor: CompositeCursor, retentions: list[Retention], fail_on_data_loss: bool
              ) -> tuple[StreamId, ...]:
    """Each partition's position to go on after; CursorError when one was trimmed past."""
    out = []
    for at, retention in zip(cursor.positions, retentions, strict=True):
        if fail_on_data_loss and at < retention.trimmed:
            raise CursorError(
                cursor.encode(), "older than the retained log in a partition (items after it "
                "were trimmed by maxAge); set failOnDataLoss=false to go on from the oldest "
                "retained item",
            )
        out.append(max(at, retention.trimmed))
    return tuple(out)


async def _epoch(bucket: ClusterBucket) -> str:
    return await bucket.current_epoch() or await bucket.ensure()


def starts(options: SourceOptions, retentions: list[Retention], epoch: str
           ) -> tuple[StreamId, ...]:
    """Each partition's position a read starts after."""
    if options.start_ms is not None:
        ms = options.start_ms - 1
        at = StreamId(ms, _LAST_SEQ) if ms >= 0 else ZERO
        return tuple(max(r.trimmed, at) for r in retentions)
    if options.start == "earliest":
        return tuple(r.trimmed for r in retentions)
    if options.start == "latest":
        return tuple(r.head for r in retentions)
    cursor = _composite(options.start, len(retentions), epoch)
    return resumable(cursor, retentions, options.fail_on_data_loss)


def ends(options: SourceOptions, retentions: list[Retention], epoch: str
         ) -> tuple[StreamId, ...] | None:
    """Each partition's last position a read may include; None: no bound."""
    if options.end_ms is not None:
        return (StreamId(max(options.end_ms, 0), _LAST_SEQ),) * len(retentions)
    if options.end is None or options.end == "latest":
        return None
    return _composite(options.end, len(retentions), epoch).positions


async def starting_cursor(bucket: ClusterBucket, options: SourceOptions) -> CompositeCursor:
    epoch = await _epoch(bucket)
    return CompositeCursor(epoch, starts(options, await bucket.retentions(), epoch))


async def stream_bound(bucket: ClusterBucket, options: SourceOptions) -> CompositeCursor | None:
    epoch = await _epoch(bucket)
    bound = ends(options, await bucket.retentions(), epoch)
    return None if bound is None else CompositeCursor(epoch, bound)


async def batch_bounds(
    bucket: ClusterBucket, options: SourceOptions
) -> tuple[CompositeCursor, CompositeCursor] | None:
    """(after, until) of a batch read, or None before the bucket exists."""
    epoch = await bucket.current_epoch()
    if epoch is None:
        return None
    retentions = await bucket.retentions()
    after = starts(options, retentions, epoch)
    if options.start == "earliest" and options.start_ms is None:
        after = (ZERO,) * len(retentions)
    until = ends(options, retentions, epoch) or tuple(r.head for r in retentions)
    return CompositeCursor(epoch, after), CompositeCursor(epoch, until)


async def latest(
    bucket: ClusterBucket, options: SourceOptions, start: CompositeCursor, max_items: int | None,
    bound: CompositeCursor | None,
) -> CompositeCursor:
    """The end of the next micro-batch after `start`: each partition's head, or `max_items`
    further in all (merged by stream id), never past `bound`."""
    retentions = await bucket.retentions()
    _composite(start.encode(), len(retentions), await _epoch(bucket))
    after = resumable(start, retentions, options.fail_on_data_loss)
    last = tuple(
        r.head if bound is None else min(r.head, bound.positions[p])
        for p, r in enumerate(retentions)
    )
    if max_items is None:
        return CompositeCursor(start.epoch, tuple(max(a, b) for a, b in zip(after, last,
                                                                           strict=True)))
    parts = await bucket.shards()
    reads = [await part.read(after[p], last[p], max_items) if last[p] > after[p] else []
             for p, part in enumerate(parts)]
    partition_of = {id(e): p for p, entries in enumerate(reads) for e in entries}
    vector = CompositeCursor(start.epoch, after)
    for entry in merge_partitions(reads, max_items):
        vector = vector.advanced(partition_of[id(entry)], entry.position)
    return vector


def with_cluster(bucket: object, use: Callable[[ClusterBucket], Awaitable[T]]) -> Awaitable[T]:
    assert isinstance(bucket, ClusterBucket)
    return use(bucket)


__all__ = [
    "batch_bounds",
    "latest",
    "resumable",
    "starting_cursor",
    "stream_bound",
    "with_cluster",
]
