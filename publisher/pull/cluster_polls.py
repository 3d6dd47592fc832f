"""The `events` long poll and the feed over a bucket in a Redis Cluster.

`events` (oldest first, after a composite cursor) reads each partition after its position,
merges the reads by stream id (`merge_partitions`: never past what a partition's read covers)
and gives each eligible item the composite cursor of everything scanned up to it, so the last
item's cursor, passed as the next `after`, skips exactly what was answered. Order is per
partition. `before` and newest-first paging need a total order the partitions do not have:
they are refused (400) for such a bucket.

The feed already has a cursor per partition: in a cluster bucket partition p's cursor is a
position of p's own log (a single-position cursor), and a composite cursor is accepted for it
too (its position p is taken).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from changefeed import feed
from changefeed.cursor import ZERO, CompositeCursor, Cursor, StreamId, parse_cursor
from changefeed.errors import CursorError, CursorGone, ParamError
from changefeed.longpoll import EventsReply, EventsRequest
from changefeed.protocol import ChangeItem
from publisher.bucket import LogEntry, Retention, merge_partitions
from publisher.pull.feed_cursors import feed_cursors

if TYPE_CHECKING:
    from publisher.config.settings import Feed as CursorSets
    from publisher.delivery.cluster_hub import ClusterHub

SCAN = 1000
"""Entries read per partition per Redis call while looking for eligible items."""


def _item(entry: LogEntry, cursor: str) -> ChangeItem:
    return ChangeItem(entry.resource, entry.sub_resources, entry.changed_resource_id,
                      entry.position.ms, cursor)


async def _scan(
    hub: ClusterHub, request: EventsRequest, start: CompositeCursor
) -> tuple[list[ChangeItem], bool]:
    """The eligible items after `start`, oldest first by stream id, and `more`."""
    parts = await hub.cluster.shards()
    vector = start
    found: list[ChangeItem] = []
    while True:
        reads = await asyncio.gather(
            *(part.read(vector.positions[p], None, SCAN) for p, part in enumerate(parts))
        )
        partition_of = {id(e): p for p, entries in enumerate(reads) for e in entries}
        merged = merge_partitions(list(reads), SCAN)
        for entry in merged:
            vector = vector.advanced(partition_of[id(entry)], entry.position)
            if request.filter.matches(entry):
                if len(found) == request.max_results:
                    return found, True
                found.append(_item(entry, vector.encode()))
        if all(len(entries) < SCAN for entries in reads):
            return found, False


def _edges(epoch: str, retentions: Sequence[Retention]) -> tuple[str, str]:
    """The reply's `oldest` (each partition's trimmed horizon: after it, every item retained)
    and `newest` (each partition's head) cursors."""
    return (
        CompositeCursor(epoch, tuple(r.trimmed for r in retentions)).encode(),
        CompositeCursor(epoch, tuple(r.head for r in retentions)).encode(),
    )


async def answer_cluster(hub: ClusterHub, request: EventsRequest) -> EventsReply:
    """Run one `events` request over a cluster bucket (oldest first, after a cursor)."""
    if request.before is not None or not request.oldest_first:
        raise ParamError(
            "a bucket in a Redis Cluster orders items per partition only: events are answered "
            "oldest first (order=oldest) after a cursor, without before"
        )
    bucket = hub.cluster
    loop_time = asyncio.get_running_loop().time
    deadline = loop_time() + request.wait
    epoch = await bucket.current_epoch() or await bucket.ensure()
    retentions = await bucket.retentions()
    n = len(retentions)
    start = CompositeCursor(epoch, (ZERO,) * n)
    missed = None
    after = request.after
    if after is not None:
        if not isinstance(after, CompositeCursor) or len(after.positions) != n:
            missed = f"the cursor is not a composite cursor of this bucket's {n} partition(s)"
        elif after.epoch != epoch:
            missed = "the cursor is of another bucket epoch (the bucket was recreated)"
        else:
            start = after
            if any(at < r.trimmed for at, r in zip(after.positions, retentions, strict=True)):
                missed = "after is older than the retained log: items after it were trimmed"
    while True:
        items, more = await _scan(hub, request, start)
        if items or missed is not None:
            break
        remaining = deadline - loop_time()
        if remaining <= 0 or not await hub.wait_past(hub.window.head, remaining):
            break
        if await bucket.current_epoch() != epoch:
            missed = "the bucket was recreated while waiting"
            items, more = [], False
            break
    retentions = await bucket.retentions()
    oldest, newest = _edges(epoch, retentions)
    return EventsReply(tuple(items), more, oldest, newest, missed is not None, missed or "")


def _position(text: str, p: int, n: int, epoch: str, retention: Retention) -> StreamId:
    """Partition p's position for the feed's input cursor `text`."""
    name = f"cursor{p}"
    if text == feed.FIRST:
        return ZERO
    if text == feed.LAST:
        return retention.head
    try:
        cursor = parse_cursor(text)
    except CursorError:
        raise ParamError(
            f"{name} must be {feed.FIRST}, {feed.LAST} or a cursor this feed issued"
        ) from None
    if isinstance(cursor, CompositeCursor):
        if len(cursor.positions) != n:
            raise ParamError(f"{name} is a composite cursor of another partition count")
        position = cursor.positions[p]
    else:
        position = cursor.position
    if cursor.epoch != epoch:
        raise CursorGone(f"{name} is of another bucket epoch (the bucket was recreated): start "
                         f"again from {feed.FIRST}")
    if position < retention.trimmed:
        raise CursorGone(f"{name} is older than the retained log (items after it were trimmed "
                         f"by maxAge/maxItems): start again from {feed.FIRST}")
    return position


async def respond_feed_cluster(
    hub: ClusterHub, request: feed.FeedRequest, cursorsets: CursorSets
) -> list[bytes]:
    """`polls.respond_feed` for a cluster bucket: partition p's cursor is a position of p's
    log. Raises ParamError, CursorGone, CursorSetsFull."""
    bucket = hub.cluster
    parts = await bucket.shards()
    n = len(parts)
    cursors = await feed_cursors(bucket, request, n, cursorsets)
    epoch = await bucket.current_epoch() or await bucket.ensure()
    retentions = await bucket.retentions()
    positions = {
        p: _position(text, p, n, epoch, retentions[p]) for p, text in cursors.items()
    }
    if request.page_size == 0:
        return []
    deadline = asyncio.get_running_loop().time() + request.wait
    while True:
        reads = await asyncio.gather(
            *(parts[p].read(position, None, request.page_size)
              for p, position in positions.items())
        )
        read = dict(zip(positions, reads, strict=True))
        chosen = merge_partitions(list(read.values()), request.page_size)
        remaining = deadline - asyncio.get_running_loop().time()
        if chosen or remaining <= 0 or not await hub.wait_past(hub.window.head, remaining):
            break
    partition_of = {id(entry): p for p, entries in read.items() for entry in entries}
    taken: dict[int, StreamId] = {}
    lines = []
    for entry in chosen:
        p = partition_of[id(entry)]
        taken[p] = entry.position
        item = _item(entry, Cursor(epoch, entry.position).encode())
        lines.append(feed.event_line(p, item, bucket.name, request.headers))
    for p in positions:
        position = taken.get(p, positions[p])
        if position != positions[p] or cursors[p] in (feed.FIRST, feed.LAST):
            lines.append(feed.checkpoint_line(p, Cursor(epoch, position).encode()))
    return lines


__all__ = ["answer_cluster", "respond_feed_cluster"]
