"""The tail: one blocking read loop per publisher process, feeding the hub.

It waits with XREAD BLOCK (no polling interval) after the last position it delivered and reads
with the tail script (tail.lua) pipelined behind the wait, so every read also brings, in the same
snapshot, what the tail checks it against (`assess`):

- another epoch (or none): the bucket was recreated, or another publisher saw a rollback;
- the log's head behind the tail's position, or the entry at that position gone without being
  trimmed: Redis lost history this publisher had seen (restored from an older snapshot, failed
  over to a lagging replica). The tail starts a new epoch;
- the trimmed horizon past the tail's position: the tail fell behind trimming (a stalled
  process, a burst) and the items in between are gone unread.

Each closes the listeners that cannot continue without a gap (4009, a reason per fault), is
logged and counted. While Redis is unreachable the tail retries with exponential backoff and
jitter and reports itself unhealthy (new registrations are refused with 1013).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import structlog

from changefeed.backoff import Backoff
from changefeed.cursor import ZERO, Cursor, StreamId
from changefeed.errors import BucketUnavailable, PartitionMismatch
from publisher.bucket import ChangeBucket, LogRead
from publisher.delivery.hub import Hub

log = structlog.get_logger(__name__)

BLOCK_MS = 5000
"""Longest single XREAD wait; the read returns at once when an item arrives."""
BATCH = 1000


@dataclass(frozen=True, slots=True)
class Gap:
    """The log was trimmed past the tail's position: the items in (position, trimmed] were
    removed before the tail read them."""

    position: StreamId
    trimmed: StreamId
    lost: int | None
    """How many items, when Redis counts the entries ever added (>= 7.0)."""


@dataclass(frozen=True, slots=True)
class NewHistory:
    """The log is not the one the tail was reading; every listener must bootstrap again."""

    reason: str
    rollback: bool
    """True: Redis lost entries this publisher had seen (the tail starts a new epoch).
    False: the epoch changed under it (the bucket was recreated, or another publisher saw a
    rollback first)."""


Fault = Gap | NewHistory


def assess(
    read: LogRead, position: StreamId, epoch: str, partitions: int, added: int | None
) -> Fault | None:
    """What `read`, made after `position` of the log of `epoch`, says about that log. Pure.

    `added` is how many entries had ever been added up to `position` (None: unknown).
    The publisher's memory of `position` is the only witness of a rollback: Redis restored from
    an older snapshot keeps the epoch and shows no sign of what it lost.
    """
    if read.epoch != epoch:
        return NewHistory(
            f"epoch {epoch} became {read.epoch}" if read.epoch else f"epoch {epoch} is gone",
            rollback=False,
        )
    if read.partitions != partitions:
        return NewHistory(
            f"the partition count {partitions} became {read.partitions or 'absent'}",
            rollback=True,
        )
    if read.head < position:
        return NewHistory(f"the log's head {read.head} is behind {position}", rollback=True)
    if not read.witnessed:
        return NewHistory(f"the entry at {position} is gone but was not trimmed", rollback=True)
    if read.trimmed > position:
        lost = None
        if read.added is not None and added is not None:
            # Every entry left is after `position` (all are after `trimmed`).
            lost = max(read.added - added - read.length, 0)
        return Gap(position, read.trimmed, lost)
    return None


def added_after(read: LogRead, added: int | None, fault: Fault | None) -> int | None:
    """How many entries had ever been added up to the last entry of `read` (or, when it has
    none, up to the position it was read after), for the next `assess`. Pure."""
    if read.added is None:
        return None
    if read.complete or isinstance(fault, NewHistory):
        return read.added
    if isinstance(fault, Gap):
        return read.added - (read.length - len(read.entries))
    return None if added is None else added + len(read.entries)


@dataclass(slots=True)
class Faults:
    """What the tail has met since the process started, for /changefeeds/stats."""

    trim_gaps: int = 0
    items_lost: int = 0
    """Items trimmed before the tail read them (counted where Redis >= 7 says how many)."""
    rollbacks: int = 0
    epoch_changes: int = 0
    redis_errors: int = 0
    """Reads that failed for want of Redis (each retry counts)."""
    reconnects: int = 0
    """Times the tail read again after failed reads (Redis reachable again)."""


class Tail:
    def __init__(self, bucket: ChangeBucket, hub: Hub, backoff: Backoff | None = None) -> None:
        self.bucket = bucket
        self.hub = hub
        self.backoff = backoff or Backoff(initial=0.05, maximum=5.0)
        self.healthy = False
        self.started = asyncio.Event()
        self.faults = Faults()
        self._stopping = asyncio.Event()
        self._partitions = 1
        self._added: int | None = None
        """Entries ever added to the log up to the window head (see `added_after`)."""
        self._read_now = True
        """Read without waiting first: after a reconnect (whatever happened meanwhile is seen
        at once) and after a full batch (more is waiting)."""

    def stop(self) -> None:
        """Make run() return. A blocked read is abandoned (its connection aborted), not awaited
        to its end."""
        self._stopping.set()
        self.bucket.abandon_reads()

    async def _read(self) -> LogRead | None:
        """The next read, or None when stopping. It runs in run()'s own task: a read per change
        at single commits, so no task or future of its own (stop() ends it by aborting its
        connection)."""
        if self._stopping.is_set():
            return None
        block = None if self._read_now else BLOCK_MS
        try:
            return await self.bucket.tail(self.hub.window.head, block, BATCH)
        except BucketUnavailable:
            if self._stopping.is_set():
                return None
            raise

    async def start(self) -> None:
        """Learn the epoch and the log head; the window starts there."""
        epoch = await self.bucket.ensure()
        read = await self.bucket.tail(ZERO, None, 0)
        self._restart(epoch, read)
        self.hub.reset(epoch, read.head)
        self.healthy = True
        self.started.set()
        log.info("tail started", epoch=epoch, head=str(read.head))

    def _restart(self, epoch: str, read: LogRead) -> None:
        """Take up the log of `read` from its head: what the next `assess` compares with. The
        caller resets the hub (closing every listener with its reason)."""
        self._partitions = read.partitions or self._partitions
        self._added = read.added
        self.hub.unread = 0
        self.hub.log_head = read.head

    async def run(self) -> None:
        delays = None
        while not self._stopping.is_set():
            try:
                if not self.started.is_set():
                    await self.start()
                    delays = None
                read = await self._read()
                if read is None:
                    return
                await self._take(read)
                if not self.healthy:
                    # Healthy only now: a registration must not be answered from a log the
                    # tail has not checked since Redis came back (it may have rolled back).
                    log.info("bucket reachable again", position=str(self.hub.window.head))
                    self.healthy = True
                    self.faults.reconnects += 1
                delays = None
            except (BucketUnavailable, PartitionMismatch) as exc:
                self._read_now = True
                delays = await self._back_off(exc, delays)

    async def _back_off(
        self, exc: BucketUnavailable | PartitionMismatch, delays: Iterator[float] | None
    ) -> Iterator[float]:
        """After a failed read: count and say it, mark the tail unhealthy (registrations are
        refused meanwhile) and wait the next delay of `delays` (a new backoff when None) or
        until stopped; the delays to go on with. A partition mismatch is a configuration fault:
        said loudly on every retry until the operator mends the config; an outage when it
        starts and again once the delays grow long."""
        if delays is None:
            delays = self.backoff.delays()
        delay = next(delays)
        self.faults.redis_errors += isinstance(exc, BucketUnavailable)
        if isinstance(exc, PartitionMismatch):
            log.error("bucket.partitions does not match the bucket", error=str(exc))
        elif self.healthy or delay >= self.backoff.maximum / 2:
            log.warning("bucket unreachable, retrying", error=str(exc), delay=round(delay, 3))
        self.healthy = False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), delay)
        return delays

    async def _take(self, read: LogRead) -> None:
        """Check `read` against what the tail knows, then hand its entries to the hub."""
        hub = self.hub
        fault = assess(read, hub.window.head, hub.epoch, self._partitions, self._added)
        self._read_now = not read.complete
        if isinstance(fault, NewHistory):
            await self._new_history(read, fault)
            return
        if isinstance(fault, Gap):
            self._skip_gap(fault)
        self._added = added_after(read, self._added, fault)
        hub.log_head = read.head
        hub.unread = 0 if self._added is None or read.added is None else read.added - self._added
        if read.entries:
            hub.publish(read.entries)

    def _skip_gap(self, gap: Gap) -> None:
        """The tail fell behind trimming: close whoever has not been sent past the horizon."""
        closed = self.hub.skip_to(gap.trimmed)
        self.faults.trim_gaps += 1
        self.faults.items_lost += gap.lost or 0
        log.warning(
            "tail fell behind the trim horizon: items trimmed before they were sent",
            position=str(gap.position),
            trimmed=str(gap.trimmed),
            lost=gap.lost,
            closed=closed,
        )

    async def _new_history(self, read: LogRead, fault: NewHistory) -> None:
        """Start over on the log as it now is, under a new epoch if this tail saw a rollback."""
        hub = self.hub
        old = hub.epoch
        listeners = len(hub.connections)
        if fault.rollback:
            await self.bucket.renew_epoch(old)
        # The epoch as it now is; created with the bucket if it has none (Redis came back
        # empty), and the partition count checked again.
        epoch = await self.bucket.ensure()
        self._restart(epoch, read)
        if fault.rollback:
            self.faults.rollbacks += 1
            log.error(
                "bucket rolled back: Redis lost changes this publisher had seen; new epoch, "
                "every listener must bootstrap again",
                reason=fault.reason,
                seen=str(hub.window.head),
                head=str(read.head),
                old=old,
                new=epoch,
                listeners=listeners,
            )
            hub.reset(epoch, read.head, rollback=True)
        else:
            self.faults.epoch_changes += 1
            log.warning(
                "bucket recreated: new epoch, closing every listener",
                reason=fault.reason,
                old=old,
                new=epoch,
                listeners=listeners,
            )
            hub.reset(epoch, read.head)

    def lag(self) -> tuple[int, float]:
        """How far the tail is behind the bucket's head at its last read: in items, and in
        seconds of commit time (the head's Redis time less that of the last item read)."""
        hub = self.hub
        if hub.unread <= 0 or hub.log_head <= hub.window.head:
            return max(hub.unread, 0), 0.0
        return hub.unread, max(hub.log_head.ms - hub.window.head.ms, 0) / 1000

    def stats(self) -> dict[str, Any]:
        """The tail's part of /changefeeds/stats."""
        hub = self.hub
        epoch = hub.epoch
        return {
            "healthy": self.healthy,
            "position": Cursor(epoch, hub.window.head).encode() if epoch else None,
            "bucketHead": Cursor(epoch, hub.log_head).encode() if epoch else None,
            "itemsBehind": hub.unread,
            "secondsBehind": self.lag()[1],
            "trimGaps": self.faults.trim_gaps,
            "itemsLost": self.faults.items_lost,
            "rollbacks": self.faults.rollbacks,
            "epochChanges": self.faults.epoch_changes,
        }
