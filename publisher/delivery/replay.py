"""Where a registration starts, the resume of one that starts behind, and the catch-up of any
connection that is not live: one path for every bucket.

A registration starts at a position in every shard (`Vector`, `start_of`): the `since` it resumes,
else the newer, per shard, of Redis's head and what this process delivered (the listener's
bootstrap, read after the reply, holds everything up to Redis's head); none while Redis holds an
epoch this process's tail has not read yet (EpochNotRead: 1013, or 503). One that starts anywhere
else than what the hub delivered (`Hub.vector`) is resumed in a task of its own (`resume`):

- it waits until the hub has delivered past its start (a cursor from a publisher whose tail is
  ahead of this one's);
- it is sent, from Redis, each shard's matching entries between its start and what the hub
  delivered (`replay_shards`: each read checked for trimming and the epoch, 4009 when it cannot
  go on), each with the cursor after it (`<epoch>.<id>` for an ordered bucket, the composite
  cursor for one in a Redis Cluster). An ordered bucket replays only what the window no longer
  holds: its window positions are the log's;
- then it catches up from the window as any lagging connection does (`catch_up`); if the
  window moved past it meanwhile it replays again. A coalescing connection that fell out of the
  window is sent its coalesced set instead (`drain_coalesced`).
"""

from __future__ import annotations

from typing import Protocol

import structlog

from changefeed.cursor import Position, StreamId
from changefeed.errors import BucketBusy, BucketUnavailable, CursorError, EpochNotRead
from changefeed.protocol import ChangeItem, CloseCode, text_frame
from changefeed.sse import change_chunk
from publisher.bucket import ChangeBucket, Vector
from publisher.delivery.coalesce import Coalesced
from publisher.delivery.counters import Counters
from publisher.delivery.lagging import Lagging
from publisher.delivery.order import Order
from publisher.delivery.subscribers import Subscriber
from publisher.delivery.waiters import Waiters
from publisher.delivery.window import Window, WindowEntry

log = structlog.get_logger(__name__)

REPLAY_BATCH = 1000
"""Log entries a resuming connection reads from Redis per call."""


class Hub(Protocol):
    """The public face of the hub (`publisher.delivery.hub.Hub`) a resume uses: named here
    because the hub starts these loops (its module imports this one)."""

    bucket: ChangeBucket
    epoch: str
    order: Order
    window: Window
    counters: Counters
    lagging: Lagging
    waiters: Waiters

    @property
    def vector(self) -> Vector: ...
    def sse_of(self, entry: WindowEntry) -> bytes: ...
    def close_slow(self, conn: Subscriber) -> None: ...
    def close_now(
        self, conn: Subscriber, code: int, reason: str, cause: str | None = None
    ) -> None: ...
    def close_trimmed(self, conn: Subscriber) -> None: ...
    def close_recreated(self, conn: Subscriber) -> None: ...
    async def writable(self, conn: Subscriber) -> bool: ...
    def wrote_one(self, conn: Subscriber, position: StreamId | None, size: int) -> None: ...


async def start_of(hub: Hub, since: str | None) -> tuple[Vector, bool]:
    """Where a registration starts, and whether that resumes `since`.

    `since` resumes when it is a cursor of this bucket's epoch and shards and each of its
    positions is within what its shard retains (trimmed <= it <= head). A `since` that is no
    cursor is refused (CursorError); one of another kind is refused by an ordered bucket, and
    not resumed by one in a Redis Cluster (a cursor of another partition count, or a
    single-position one, starts over). Raises EpochNotRead while Redis holds an epoch the tail
    has not read yet: no registration is served until it has.
    """
    bucket = hub.bucket
    cursor: Vector | None = None
    if since is not None:
        try:
            cursor = await bucket.log.decode_cursor(since)
        except CursorError:
            if bucket.log.ordered:
                raise
            Position.decode(since)  # not a cursor at all: refused on any bucket
    retentions = await bucket.log.retentions()
    # Redis's epoch too: another publisher may have started a new one (a rollback) that this
    # one's tail has not read yet (a shard of a bucket in a Redis Cluster holds a copy).
    current = all(r.epoch == hub.epoch for r in retentions)
    if current and not bucket.log.ordered:
        current = await bucket.log.current_epoch() == hub.epoch
    if (
        cursor is not None
        and current
        and cursor.epoch == hub.epoch
        and all(r.trimmed <= at <= r.head
                for r, at in zip(retentions, cursor.positions, strict=True))
    ):
        return cursor, True
    if not current:
        # Served from the tail's history, the registration would be sent that history's late
        # entries after a bootstrap of the new one, from a head that may be behind what the
        # listener had (the nemesis's 30-minute soak, seed 12: a listener got a change again).
        raise EpochNotRead(
            f"registration: Redis holds another epoch than {hub.epoch}, the one this "
            "publisher's tail has read"
        )
    vector = hub.vector
    return vector.with_positions(
        [max(r.head, at) for r, at in zip(retentions, vector.positions, strict=True)]
    ), False


async def resume(hub: Hub, conn: Subscriber, start: Vector) -> None:
    """Send `conn` everything after `start`, then make it live (see the module's docstring)."""
    try:
        epoch = hub.epoch
        while not hub.vector.covers(start) and not conn.closing and hub.epoch == epoch:
            # A cursor from a publisher whose tail is ahead of ours: wait for ours.
            await hub.waiters.advanced()
        if conn.closing:
            return
        if hub.epoch != epoch or start.epoch != hub.epoch:
            hub.close_recreated(conn)
            return
        position = await replay_to_window(hub, conn, start)
        if position is None:
            return
        conn.passed(position)
        await catch_up(hub, conn)  # checks the window before it first awaits
    except _ENDINGS as exc:
        _ended(hub, conn, "resume", exc)


async def replay_to_window(hub: Hub, conn: Subscriber, start: Vector) -> StreamId | None:
    """Replay from Redis what `conn` missed after `start` that the window does not hold; the
    window position it goes on from, or None when it was closed."""
    while True:
        local = hub.order.window_position(start)
        if local is not None and hub.window.covers(local):
            return local
        until, position = hub.order.replay_target(hub.epoch, hub.window.base, hub.window.head)
        if not await replay_shards(hub, conn, start, until):
            return None
        if hub.epoch != start.epoch:
            hub.close_recreated(conn)
            return None
        if hub.window.covers(position):
            return position
        log.debug("resume outrun by the window: replaying again", remote=conn.remote)
        start = until


async def replay_shards(hub: Hub, conn: Subscriber, start: Vector, until: Vector) -> bool:
    """Send `conn` each shard's matching entries in (start, until], shard by shard (order is
    per shard), each with the cursor after it. False when the connection was closed (trimmed
    past its position, a new epoch)."""
    composite = start.composite
    vector = start
    shards = await hub.bucket.log.shards()
    for s, shard in enumerate(shards):
        position, end = start.positions[s], until.positions[s]
        while position < end and not conn.closing:
            read = await shard.tail(position, None, REPLAY_BATCH)
            if read.epoch != hub.epoch:
                # The tail resets the hub when it reads this too; this one cannot wait for it.
                hub.close_recreated(conn)
                return False
            if read.trimmed > position:
                hub.close_trimmed(conn)
                return False
            rows = [row for row in read.entries if row.position <= end]
            if not rows:
                break
            for row in rows:
                vector = vector.advanced(s, row.position)
                if conn.wants(row):
                    if not await hub.writable(conn):
                        return False
                    cursor = vector.encode()
                    payload = ChangeItem(row.resource, row.sub_resources,
                                         row.changed_resource_id, row.position.ms,
                                         cursor).encode()
                    frame = change_chunk(cursor, payload) if conn.sse else text_frame(payload)
                    conn.transport.write(frame)
                    # An ordered bucket's log positions are window positions too.
                    hub.wrote_one(conn, None if composite else row.position, len(frame))
                position = row.position
    return not conn.closing


async def catch_up(hub: Hub, conn: Subscriber) -> None:
    """Send `conn` what it missed, from Redis then from the window, then make it live."""
    try:
        while not conn.closing:
            if conn.coalesced is not None:
                await drain_coalesced(hub, conn, conn.coalesced)
                return
            window = hub.window
            if conn.position > window.head:
                # A cursor from a publisher whose tail is ahead of ours: wait for ours.
                await hub.waiters.advanced()
                continue
            if not window.covers(conn.position):
                # A resuming connection that fell out of the window replays again from
                # Redis where its window position is a position of the log (an ordered
                # bucket); otherwise it is slow.
                start = hub.order.vector_at(hub.epoch, conn.position)
                if not conn.replaying or start is None:
                    hub.close_slow(conn)
                    return
                position = await replay_to_window(hub, conn, start)
                if position is None:
                    return
                conn.passed(position)
                continue
            entries = window.after(conn.position)
            if not entries:
                hub.lagging.go_live(conn)
                return
            for entry in entries:
                if conn.wants(entry):
                    if not await hub.writable(conn):
                        return
                    if conn.coalesced is not None:
                        break  # switched while it waited: `entry` is in its set
                    frame = hub.sse_of(entry) if conn.sse else entry.frame
                    conn.transport.write(frame)
                    hub.wrote_one(conn, entry.position, len(frame))
                conn.passed(entry.position)
    except _ENDINGS as exc:
        _ended(hub, conn, "catch-up", exc)


async def drain_coalesced(hub: Hub, conn: Subscriber, coalesced: Coalesced) -> None:
    """Send each pending id once, oldest newest-change first, while the fan-out keeps
    folding new items in; live again right after the last one (`caughtUp`), with nothing
    awaited in between."""
    while not conn.closing:
        if not coalesced:
            hub.lagging.go_live(conn)  # only when nothing it wanted fell out of the window
            return
        if not await hub.writable(conn):
            return
        item, position = coalesced.pop(hub.epoch)
        frame = text_frame(item.encode())
        conn.transport.write(frame)
        conn.sent(position)
        hub.counters.wrote(1, len(frame))
        if item.caught_up:
            hub.counters.coalescing_finished(coalesced.folded, coalesced.sent_ids)
            log.info(
                "slow consumer caught up",
                instance=conn.registration.instance,
                service=conn.registration.service,
                remote=conn.remote,
                items=coalesced.folded,
                sent=coalesced.sent_ids,
            )
            hub.lagging.go_live(conn)
            return


_ENDINGS = (ConnectionError, RuntimeError, BucketBusy, BucketUnavailable)
"""What ends a resume or a catch-up before the connection is live: `_ended` says how."""


def _ended(hub: Hub, conn: Subscriber, what: str, exc: Exception) -> None:
    """A resume or catch-up (`what`) that `exc` ended: a connection gone is only logged; an
    overloaded publisher closes it with OVERLOADED, an unavailable bucket with TRY_AGAIN_LATER,
    so the listener comes back and resumes."""
    if isinstance(exc, BucketBusy):
        log.warning(f"{what} failed: publisher overloaded", remote=conn.remote, error=str(exc))
        hub.close_now(conn, CloseCode.OVERLOADED, "publisher overloaded during replay")
    elif isinstance(exc, BucketUnavailable):
        log.warning(f"{what} failed: bucket unavailable", remote=conn.remote, error=str(exc))
        hub.close_now(conn, CloseCode.TRY_AGAIN_LATER, "bucket unavailable during replay")
    else:
        log.info(f"{what} ended: connection gone", remote=conn.remote, error=str(exc))


__all__ = [
    "REPLAY_BATCH",
    "catch_up",
    "drain_coalesced",
    "replay_shards",
    "replay_to_window",
    "resume",
    "start_of",
]
