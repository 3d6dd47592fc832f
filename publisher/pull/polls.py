"""Answering pull requests over the change bucket's log: `events` long polls and ZeroEventHub feed
pages (the I/O half; the wire formats are `changefeed.longpoll` and `changefeed.feed`). One path
for every bucket: each shard's log is read after its position and the reads are merged by stream
id (`merge_partitions`: never past what a read covers).

`events` oldest first gives each eligible item the cursor of everything scanned up to it (an
ordered bucket's `<epoch>.<id>`, the composite cursor of a bucket in a Redis Cluster), so the last
item's cursor, passed as the next `after`, skips exactly what was answered. `before` and newest
first need a total order of the items: only an `ordered` bucket has one (400 otherwise).

The feed has a cursor per partition, a position of that partition's shard (a single-position
cursor; a composite cursor is accepted too, its position p taken).

The publisher keeps no state per client: each request scans the shared log in Redis, and a
waiting request waits on the hub's one shared "window advanced" event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from changefeed import feed
from changefeed.cursor import ZERO, Position, StreamId, is_composite
from changefeed.errors import CursorError, CursorGone, ParamError
from changefeed.longpoll import EventFilter, EventsReply, EventsRequest
from changefeed.protocol import ChangeItem
from publisher.bucket import LogEntry, Retention, Vector, merge_partitions
from publisher.pull.feed_cursors import feed_cursors

if TYPE_CHECKING:
    from publisher.bucket import ChangeBucket
    from publisher.config.settings import Feed as CursorSets
    from publisher.delivery.hub import Hub

SCAN = 1000
"""Log entries read per shard per Redis call while looking for eligible items."""
NOT_ORDERED = (
    "this bucket is not `ordered` (a Redis Cluster orders items per partition only): events are "
    "answered oldest first (order=oldest) after a cursor, without before"
)


def _edges(epoch: str, retentions: Sequence[Retention], ordered: bool) -> tuple[str, str]:
    """The reply's `oldest` and `newest` cursors: an ordered bucket's oldest retained item and
    head (both "" when the log is empty); each shard's trimmed horizon (after it, every item
    retained) and head for a bucket in a Redis Cluster."""
    if ordered:
        retention = retentions[0]
        if retention.oldest is None:
            return "", ""
        return (Position.single(epoch, retention.oldest).encode(),
                Position.single(epoch, retention.head).encode())
    return (
        Position(epoch, tuple(r.trimmed for r in retentions)).encode(),
        Position(epoch, tuple(r.head for r in retentions)).encode(),
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


Scan = tuple[list[ChangeItem], bool, Vector]
"""Eligible items, `more`, and the position of the newest item found."""


class EpochMoved(Exception):
    """A read of the log found another epoch than the one the request is answered in: its
    entries are of another history, not to be sent under this epoch's cursors."""


async def scan(
    bucket: ChangeBucket, request: EventsRequest, start: Vector, before: StreamId | None
) -> Scan:
    """The eligible items after `start` (and before `before`, an ordered bucket's), oldest
    first by stream id, each with the cursor of everything scanned up to it, and `more`.
    Each read takes the epoch in the same snapshot as its entries: EpochMoved when it is not
    `start`'s."""
    shards = await bucket.log.shards()
    vector = reach = start
    found: list[ChangeItem] = []
    while True:
        snapshots = await asyncio.gather(
            *(shard.tail(vector.positions[s], None, SCAN) for s, shard in enumerate(shards))
        )
        if any(snapshot.epoch != start.epoch for snapshot in snapshots):
            raise EpochMoved
        reads = [snapshot.entries for snapshot in snapshots]
        shard_of = {id(e): s for s, entries in enumerate(reads) for e in entries}
        merged = reads[0] if len(reads) == 1 else merge_partitions(list(reads), SCAN)
        for entry in merged:
            if before is not None and entry.position >= before:
                return found, False, reach
            vector = vector.advanced(shard_of[id(entry)], entry.position)
            if request.filter.matches(entry):
                if len(found) == request.max_results:
                    return found, True, reach
                found.append(ChangeItem(entry.resource, entry.sub_resources,
                                        entry.changed_resource_id, entry.position.ms,
                                        vector.encode()))
                reach = vector
        if all(snapshot.complete for snapshot in snapshots):
            return found, False, reach


async def scan_newest(
    bucket: ChangeBucket, request: EventsRequest, start: Vector, after: StreamId | None,
    before: StreamId | None,
) -> Scan:
    """The eligible items of an ordered bucket in (after, before), newest first, and `more`."""
    found: list[LogEntry] = []
    upper = before
    while True:
        entries = await bucket.log.read_newest(upper, after, SCAN)
        more = select(entries, request.filter, request.max_results, found)
        if more or len(entries) < SCAN:
            break
        upper = entries[-1].position
    reach = start.with_positions([found[0].position]) if found else start
    return [entry.item(start.epoch) for entry in found], more, reach


OTHER_EPOCH = (
    "the cursor is of another bucket epoch whose entry is not in this one: entries this reader "
    "was given were rolled back (Redis lost them), or the bucket was recreated"
)
EPOCH_KEPT = (
    "the bucket began a new epoch (Redis lost history) that holds this cursor's entry: nothing "
    "this reader was given was lost; ask after resume_after, its position in the new epoch"
)
ROLLED_BACK = (
    "the cursor's entry is gone from the log though it was not trimmed: entries this reader was "
    "given were rolled back (Redis lost them)"
)


async def _held(bucket: ChangeBucket, epoch: str, vector: Vector) -> tuple[bool, bool]:
    """Whether epoch `epoch`'s history holds the entry at each of `vector`'s positions (a
    position 0-0 where nothing was trimmed holds trivially, one at or before the trimmed
    horizon cannot tell), and whether none is known to be gone (an untrimmed position whose
    entry the log lacks: a rollback). One snapshot of each shard, with its epoch."""
    shards = await bucket.log.shards()
    reads = await asyncio.gather(
        *(shard.tail(at, None, 0) for shard, at in zip(shards, vector.positions, strict=True))
    )
    same = all(read.epoch == epoch for read in reads)
    held = same and all(
        read.witnessed and (read.trimmed < at or at == read.trimmed == ZERO)
        for read, at in zip(reads, vector.positions, strict=True)
    )
    return held, not same or all(read.witnessed for read in reads)


async def _bounds(
    bucket: ChangeBucket, request: EventsRequest, epoch: str, retentions: Sequence[Retention]
) -> tuple[Vector, Vector | None, Vector | None, str | None]:
    """Where a request's scan starts, its `after` and `before` as this bucket's vectors, and
    why the client missed items (None: it did not): a cursor of another kind is ignored, an
    `after` trimmed in any shard is missed, one whose entry was rolled back is missed (the scan
    starts at the oldest), and one of another epoch is missed, from the oldest unless the new
    history holds its entry (EPOCH_KEPT: the scan starts at the same position in this epoch)."""
    start = bucket.log.vector(epoch, [ZERO] * len(retentions))
    after: Vector | None = None
    before: Vector | None = None
    for name, cursor in (("after", request.after), ("before", request.before)):
        if cursor is None:
            continue
        try:
            vector = await bucket.log.decode_cursor(cursor.encode())
        except CursorError as exc:
            return start, None, None, exc.why
        if vector.epoch != epoch and name == "before":
            return start, None, None, OTHER_EPOCH
        if vector.epoch != epoch:
            kept = start.with_positions(vector.positions)
            if (await _held(bucket, epoch, kept))[0]:
                return kept, kept, None, EPOCH_KEPT
            return start, None, None, OTHER_EPOCH
        after, before = (vector, before) if name == "after" else (after, vector)
    if after is not None:
        if any(at < r.trimmed for at, r in zip(after.positions, retentions, strict=True)):
            return after, after, before, (
                "after is older than the retained log: items after it were trimmed")
        if not (await _held(bucket, epoch, after))[1]:
            return start, None, None, ROLLED_BACK
        return after, after, before, None
    return start, after, before, None


async def answer(bucket: ChangeBucket, hub: Hub, request: EventsRequest) -> EventsReply:
    """Run one `events` request: scan, and wait for new items when the ADR says so. A scan
    that meets another epoch than the one the request was begun in starts it over, in the
    new one (its `after` then of another epoch: told so before anything of the new one)."""
    if not bucket.log.ordered and (request.before is not None or not request.oldest_first):
        raise ParamError(NOT_ORDERED)
    while True:
        with contextlib.suppress(EpochMoved):
            return await _answer(bucket, hub, request)


async def _answer(bucket: ChangeBucket, hub: Hub, request: EventsRequest) -> EventsReply:
    loop_time = asyncio.get_running_loop().time
    deadline = loop_time() + request.wait
    retentions = await bucket.log.retentions()
    epoch = retentions[0].epoch or ""
    start, after, before, missed = await _bounds(bucket, request, epoch, retentions)
    if missed is EPOCH_KEPT:  # told before anything of the new epoch is served
        oldest, newest = _edges(epoch, retentions, bucket.log.ordered)
        return EventsReply((), False, oldest, newest, True, missed, start.encode())
    bound = None if before is None else before.positions[0]
    while True:
        reach = start
        items: list[ChangeItem]
        if bound is not None and bound <= ZERO:
            items, more = [], False  # nothing is older than the start
        elif request.oldest_first:
            items, more, reach = await scan(bucket, request, start, bound)
        else:
            floor = None if start.positions[0] == ZERO and after is None else start.positions[0]
            items, more, reach = await scan_newest(bucket, request, start, floor, bound)
        if items or before is not None or missed is not None:
            break  # a client that missed items must learn it now, not after the wait
        remaining = deadline - loop_time()
        if remaining <= 0:
            break
        # Nothing eligible up to each shard's head: wait for the tail to read past it, then
        # look only at what is newer (no busy polling: one shared event).
        heads = start.with_positions(
            [max(at, r.head) for at, r in zip(start.positions, retentions, strict=True)]
        )
        start = heads
        if not await hub.wait_beyond(heads.positions, remaining):
            break
        retentions = await bucket.log.retentions()
        if retentions[0].epoch != epoch:
            missed = "the bucket was recreated while waiting"
            items, more, reach = [], False, start
            break
        if missed is None and any(
            at < r.trimmed for at, r in zip(start.positions, retentions, strict=True)
        ):
            # Items after what the client has seen were trimmed before this publisher read
            # them (it was stalled): say so now, with whatever eligible items are left.
            missed = "items after the cursor were trimmed while waiting"
    if items and not start.with_positions([r.head for r in retentions]).covers(reach):
        retentions = await bucket.log.retentions()  # `newest` must not be older than an item
    oldest, newest = _edges(epoch, retentions, bucket.log.ordered)
    return EventsReply(tuple(items), more, oldest, newest, missed is not None, missed or "")


def _position(text: str, p: int, epoch: str, retention: Retention) -> StreamId:
    """Partition p's position for the feed's input cursor `text` (a composite cursor stands for
    its position p). Raises ParamError or CursorGone."""
    if is_composite(text):
        try:
            cursor = Position.decode(text)
        except CursorError:
            cursor = None
        if cursor is None or p >= len(cursor.positions):
            raise ParamError(f"cursor{p} is not a cursor this feed issued for partition {p}")
        text = Position.single(cursor.epoch, cursor.positions[p]).encode()
    return feed.resolve(text, f"cursor{p}", epoch, retention.trimmed, retention.head)


async def respond_feed(
    bucket: ChangeBucket,
    hub: Hub,
    request: feed.FeedRequest,
    partitions: int,
    cursorsets: CursorSets,
) -> list[bytes]:
    """The NDJSON lines of one feed request. Its consumer (if any) must be one of
    `cursorsets.consumers` (the caller checks). Raises ParamError, CursorGone, CursorSetsFull."""
    cursors = await feed_cursors(bucket, request, partitions, cursorsets)
    retentions = await bucket.log.retentions()
    epoch = retentions[0].epoch or await bucket.log.ensure()
    shard_of = {p: (await bucket.log.locate(p))[0].index for p in cursors}
    positions = {
        p: _position(text, p, epoch, retentions[shard_of[p]]) for p, text in cursors.items()
    }
    if request.page_size == 0:
        return []
    deadline = asyncio.get_running_loop().time() + request.wait
    while True:
        read, heads, epochs = await bucket.log.read_partitions(positions, request.page_size)
        if epochs != {epoch}:
            # Redis lost history (the bucket was renewed or created again) after the cursors
            # were resolved against the old epoch, while the request waited perhaps: what was
            # read is of another history, and would go out under the old epoch's cursors.
            raise CursorGone("the bucket's epoch changed (Redis lost history): start again "
                             "from _first or _last")
        chosen = merge_partitions(list(read.values()), request.page_size)
        remaining = deadline - asyncio.get_running_loop().time()
        if chosen or remaining <= 0:
            break
        snapshot = [hub.position(s) for s in range(len(retentions))]
        for p, head in heads.items():
            snapshot[shard_of[p]] = head
        if not await hub.wait_beyond(snapshot, remaining):
            break
    partition_of = {id(entry): p for p, entries in read.items() for entry in entries}
    lines = [
        feed.event_line(partition_of[id(e)], e.item(epoch), bucket.name, request.headers)
        for e in chosen
    ]
    taken: dict[int, list[LogEntry]] = {}
    for entry in chosen:
        taken.setdefault(partition_of[id(entry)], []).append(entry)
    for p, entries in read.items():
        mine = taken.get(p, [])
        if len(entries) < request.page_size and len(mine) == len(entries):
            position = max(heads[p], positions[p])  # read to its end: the snapshot's head
        else:
            position = mine[-1].position if mine else positions[p]
        if position != positions[p] or cursors[p] in (feed.FIRST, feed.LAST):
            lines.append(feed.checkpoint_line(p, Position.single(epoch, position).encode()))
    return lines


__all__ = ["EPOCH_KEPT", "NOT_ORDERED", "OTHER_EPOCH", "ROLLED_BACK", "SCAN", "answer",
           "respond_feed", "scan", "scan_newest", "select"]
