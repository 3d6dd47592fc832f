"""Answering pull requests over the change bucket's log: `events` long polls and ZeroEventHub feed
pages (the I/O half; the wire formats are `changefeed.longpoll` and `changefeed.feed`).

The publisher keeps no state per client: each request scans the shared log in Redis, and a
waiting request waits on the hub's one shared "window advanced" event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from changefeed import feed
from changefeed.cursor import ZERO, CompositeCursor, Cursor, StreamId
from changefeed.longpoll import EventFilter, EventsReply, EventsRequest
from publisher.bucket import LogEntry, Retention, merge_partitions
from publisher.delivery.cluster_hub import ClusterHub
from publisher.pull.cluster_polls import answer_cluster, respond_feed_cluster
from publisher.pull.feed_cursors import feed_cursors

if TYPE_CHECKING:
    from publisher.bucket import ChangeBucket
    from publisher.config.settings import Feed as CursorSets
    from publisher.delivery.hub import Hub

SCAN = 1000
"""Log entries read per Redis call while looking for eligible items."""


def reply_of(
    entries: Sequence[LogEntry], more: bool, retention: Retention, missed: str | None
) -> EventsReply:
    """The wire reply for `entries` of the log described by `retention`."""
    epoch = retention.epoch or ""
    empty = retention.oldest is None
    return EventsReply(
        tuple(entry.item(epoch) for entry in entries),
        more,
        "" if empty else Cursor(epoch, retention.oldest).encode(),  # type: ignore[arg-type]
        "" if empty else Cursor(epoch, retention.head).encode(),
        missed is not None,
        missed or "",
    )


def select(
    entries: Sequence[LogEntry], filter: EventFilter, wanted: int, found: list[LogEntry]
) -> bool:
    """Append matching `entries` to `found` up to `wanted`; True when one more matched (`more`)."""
    for entry in entries:
        if filter.matches(entry):
            if len(found) == wanted:
                return True
            found.append(entry)
    return False


async def scan(
    bucket: ChangeBucket,
    request: EventsRequest,
    after: StreamId | None,
    before: StreamId | None,
) -> tuple[list[LogEntry], bool]:
    """The eligible items in (after, before) in the request's order, and `more`."""
    found: list[LogEntry] = []
    if before is not None and before <= ZERO:
        return found, False  # nothing is older than the start (and Redis refuses `(0-0`)
    if request.oldest_first:
        position = after or StreamId(0, 0)
        while True:
            entries = await bucket.read(position, None, SCAN)
            if before is not None:
                entries = [e for e in entries if e.position < before]
            if select(entries, request.filter, request.max_results, found):
                return found, True
            if len(entries) < SCAN:
                return found, False
            position = entries[-1].position
    upper = before
    while True:
        entries = await bucket.read_newest(upper, after, SCAN)
        if select(entries, request.filter, request.max_results, found):
            return found, True
        if len(entries) < SCAN:
            return found, False
        upper = entries[-1].position


async def answer(bucket: ChangeBucket, hub: Hub, request: EventsRequest) -> EventsReply:
    """Run one `events` request: scan, and wait for new items when the ADR says so."""
    if isinstance(hub, ClusterHub):
        return await answer_cluster(hub, request)
    loop_time = asyncio.get_running_loop().time
    deadline = loop_time() + request.wait
    retention = await bucket.retention()
    epoch = retention.epoch
    missed = None
    after = request.after.position if isinstance(request.after, Cursor) else None
    before = request.before.position if isinstance(request.before, Cursor) else None
    for cursor in (request.after, request.before):
        if isinstance(cursor, CompositeCursor):
            missed = "the cursor is composite (of a bucket in a Redis Cluster), not of this bucket"
            after = before = None
        elif cursor is not None and cursor.epoch != epoch:
            missed = "the cursor is of another bucket epoch (the bucket was recreated)"
            after = before = None
    if missed is None and after is not None and after < retention.trimmed:
        missed = "after is older than the retained log: items after it were trimmed"
    floor = after
    while True:
        items, more = await scan(bucket, request, floor, before)
        if items or before is not None or missed is not None:
            break  # a client that missed items must learn it now, not after the wait
        remaining = deadline - loop_time()
        if remaining <= 0:
            break
        # Nothing eligible up to this head: wait for the tail to read past it, then look only
        # at what is newer (no busy polling: one shared event).
        floor = max(floor or retention.head, retention.head)
        if not await hub.wait_past(floor, remaining):
            break
        retention = await bucket.retention()
        if retention.epoch != epoch:
            missed = "the bucket was recreated while waiting"
            items, more = [], False
            break
        if missed is None and floor < retention.trimmed:
            # Items after what the client has seen were trimmed before this publisher read
            # them (it was stalled): say so now, with whatever eligible items are left.
            missed = "items after the cursor were trimmed while waiting"
    if items and max(items[0].position, items[-1].position) > retention.head:
        retention = await bucket.retention()  # `newest` must not be older than an item
    return reply_of(items, more, retention, missed)


async def respond_feed(
    bucket: ChangeBucket,
    hub: Hub,
    request: feed.FeedRequest,
    partitions: int,
    cursorsets: CursorSets,
) -> list[bytes]:
    """The NDJSON lines of one feed request. Its consumer (if any) must be one of
    `cursorsets.consumers` (the caller checks). Raises ParamError, CursorGone, CursorSetsFull."""
    if isinstance(hub, ClusterHub):
        return await respond_feed_cluster(hub, request, cursorsets)
    cursors = await feed_cursors(bucket, request, partitions, cursorsets)

    retention = await bucket.retention()
    epoch = retention.epoch or await bucket.ensure()
    positions = {
        p: feed.resolve(text, f"cursor{p}", epoch, retention.trimmed, retention.head)
        for p, text in cursors.items()
    }
    if request.page_size == 0:
        return []
    deadline = asyncio.get_running_loop().time() + request.wait
    while True:
        read, heads = await bucket.read_partitions(positions, request.page_size)
        head = max(heads.values())
        chosen = merge_partitions(list(read.values()), request.page_size)
        remaining = deadline - asyncio.get_running_loop().time()
        if chosen or remaining <= 0 or not await hub.wait_past(head, remaining):
            break
    partition_of = {id(entry): p for p, entries in read.items() for entry in entries}
    lines = [
        feed.event_line(partition_of[id(e)], e.item(epoch), bucket.name, request.headers)
        for e in chosen
    ]
    last_chosen = chosen[-1].position if chosen else None
    for p, entries in read.items():
        complete = len(entries) < request.page_size
        if complete and (not entries or (last_chosen and entries[-1].position <= last_chosen)):
            position = max(head, positions[p])  # read to its end: the snapshot's head
        else:
            taken = [e.position for e in entries if last_chosen and e.position <= last_chosen]
            position = taken[-1] if taken else positions[p]
        if position != positions[p] or cursors[p] in (feed.FIRST, feed.LAST):
            lines.append(feed.checkpoint_line(p, Cursor(epoch, position).encode()))
    return lines


__all__ = ["SCAN", "answer", "reply_of", "respond_feed", "scan", "select"]
