"""The tail: the blocking reads of a publisher process, feeding the hub.

It reads each shard of the bucket (`publisher.bucket.Shard`): an ordered bucket's one shard in
run()'s own task, a bucket in a Redis Cluster's shards in one read loop each. Each waits with
XREAD BLOCK (no polling interval) after the last position it delivered and reads with the tail
script (tail.lua) pipelined behind the wait, so every read also brings, in the same snapshot, what
the tail checks it against (`assess`, per shard):

- another epoch (or none): the bucket was recreated, or another publisher saw a rollback;
- the log's head behind the tail's position, or the entry at that position gone without being
  trimmed: Redis lost history this publisher had seen (restored from an older snapshot, failed
  over to a lagging replica). The tail starts a new epoch;
- the trimmed horizon past the tail's position: the tail fell behind trimming (a stalled
  process, a burst) and the items in between are gone unread.

Each closes the listeners that cannot continue without a gap (4009, a reason per fault), is
logged and counted: a new history in any shard restarts every shard at its head; a trim gap in a
shard closes the listeners that had not been sent past it. While Redis is unreachable the tail
retries with exponential backoff and jitter and reports itself unhealthy (new registrations are
refused with 1013).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import structlog

from changefeed.backoff import Backoff
from changefeed.cursor import ZERO, StreamId
from changefeed.errors import BucketUnavailable, PartitionMismatch
from publisher.bucket import ChangeBucket, LogRead, Shard
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
    unexpected: int = 0
    """Reads that failed with an error that is not Redis's (a bug, logged with its traceback):
    the tail backs off and reads again, as after an outage, rather than end while the publisher
    goes on serving (the nemesis, seed 5079: a connection closed under its handshake raised
    uvloop's RuntimeError, the tail task ended, and the publisher stayed ready, its listeners
    sent nothing more)."""


class _Restart(Exception):
    """A shard's read showed a new history: every shard starts over."""

    def __init__(self, shard: int, read: LogRead, fault: NewHistory) -> None:
        super().__init__(fault.reason)
        self.shard = shard
        self.read = read
        self.fault = fault


@dataclass(slots=True)
class _Follow:
    """What the tail knows of one shard between reads."""

    partitions: int = 1
    added: int | None = None
    """Entries ever added to the shard's log up to what was delivered (see `added_after`)."""
    unread: int = 0
    read_now: bool = True
    """Read without waiting first: after a reconnect (whatever happened meanwhile is seen
    at once) and after a full batch (more is waiting)."""


class Tail:
    def __init__(self, bucket: ChangeBucket, hub: Hub, backoff: Backoff | None = None) -> None:
        self.bucket = bucket
        self.hub = hub
        self.backoff = backoff or Backoff(initial=0.05, maximum=5.0)
        self.healthy = False
        self.started = asyncio.Event()
        self.faults = Faults()
        self._stopping = asyncio.Event()
        self._shards: list[Shard] = []
        self._follow: list[_Follow] = []
        self.heads: tuple[StreamId, ...] = (hub.window.head,)
        """Each shard's head at the last read of it."""
        self.unread = 0
        """Log entries after the window head at the last reads (items the tail is behind)."""

    def stop(self) -> None:
        """Make run() return. A blocked read is abandoned (its connection aborted), not awaited
        to its end."""
        self._stopping.set()
        self.bucket.log.abandon_reads()

    async def _read(self, s: int) -> LogRead | None:
        """The next read of shard `s`, or None when stopping. An ordered bucket's runs in run()'s
        own task: a read per change at single commits, so no task or future of its own (stop()
        ends it by aborting its connection)."""
        if self._stopping.is_set():
            return None
        follow = self._follow[s]
        block = None if follow.read_now else BLOCK_MS
        try:
            return await self._shards[s].tail(self.hub.position(s), block, BATCH)
        except BucketUnavailable:
            if self._stopping.is_set():
                return None
            raise

    async def _heads(self) -> list[LogRead]:
        self._shards = await self.bucket.log.shards()
        return list(await asyncio.gather(*(s.tail(ZERO, None, 0) for s in self._shards)))

    async def start(self) -> None:
        """Learn the epoch and each shard's head; the window starts there."""
        epoch = await self.bucket.log.ensure()
        reads = await self._heads()
        self._restart(reads)
        self.hub.restart(epoch, self.heads)
        self.healthy = True
        self.started.set()
        log.info("tail started", epoch=epoch, head=self.hub.vector.encode(), shards=len(reads))

    def _restart(self, reads: list[LogRead]) -> None:
        """Take up each shard's log of `reads` from its head: what the next `assess` compares
        with. The caller restarts the hub (closing every listener with its reason)."""
        olds = self._follow
        self._follow = [
            _Follow(read.partitions or (olds[s].partitions if s < len(olds) else 1), read.added)
            for s, read in enumerate(reads)
        ]
        self.heads = tuple(read.head for read in reads)
        self.unread = 0

    async def run(self) -> None:
        delays = None
        # A new history met and not taken up yet. It is taken up inside the try below, so
        # that a Redis failing meanwhile is backed off from and the restart tried again (taken
        # up in the handler, such a failure ended the tail task).
        restart: _Restart | None = None
        while not self._stopping.is_set():
            try:
                if restart is not None:
                    await self._new_history(restart)
                    restart = None
                if not self.started.is_set():
                    await self.start()
                    delays = None
                if len(self._shards) == 1:
                    read = await self._read(0)
                    if read is None:
                        return
                    self._take(0, read)
                elif not await self._follow_all():
                    return
                delays = None
            except _Restart as found:
                restart = found
            except Exception as exc:  # an outage, a config fault, or anything else: backed off
                if not isinstance(exc, (BucketUnavailable, PartitionMismatch)):
                    self.faults.unexpected += 1  # said loudly, and the tail goes on
                    log.exception("tail: unexpected error; reading again after a backoff")
                for follow in self._follow:
                    follow.read_now = True
                delays = await self._back_off(exc, delays)

    async def _follow_all(self) -> bool:
        """Read every shard, one loop each, until one fails (raised) or the tail stops
        (False)."""
        tasks = [asyncio.create_task(self._follow_shard(s), name=f"tail shard {s}")
                 for s in range(len(self._shards))]
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            done, _ = await asyncio.wait([*tasks, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in [*tasks, stopping]:
                if not task.done():
                    # Abandoned, not awaited: a blocked XREAD is not always given up promptly.
                    task.cancel()
                    task.add_done_callback(lambda t: t.cancelled() or t.exception())
        for task in done:
            if task is not stopping and not task.cancelled():
                error = task.exception()
                if error is not None:
                    raise error  # what ended a shard's loop (the others' are retrieved)
        return False

    async def _follow_shard(self, s: int) -> None:
        while True:
            read = await self._read(s)
            if read is None:
                return
            self._take(s, read)

    def _take(self, s: int, read: LogRead) -> None:
        """Check `read` of shard `s` against what the tail knows, then hand its entries to the
        hub. Raises _Restart on a new history."""
        hub = self.hub
        follow = self._follow[s]
        position = hub.position(s)
        fault = assess(read, position, hub.epoch, follow.partitions, follow.added)
        follow.read_now = not read.complete
        if isinstance(fault, NewHistory):
            raise _Restart(s, read, fault)
        if isinstance(fault, Gap):
            self._skip_gap(s, fault)
        follow.added = added_after(read, follow.added, fault)
        heads = self.heads
        if len(heads) == 1:
            self.heads = (read.head,)
        else:
            self.heads = (*heads[:s], read.head, *heads[s + 1:])
        added = follow.added
        follow.unread = 0 if added is None or read.added is None else read.added - added
        self.unread = follow.unread if len(self._follow) == 1 else sum(
            f.unread for f in self._follow
        )
        if read.entries:
            hub.fan_out(read.entries, s)
        if not self.healthy:
            # Healthy only now: a registration must not be answered from a log the tail has
            # not checked since Redis came back (it may have rolled back).
            log.info("bucket reachable again", position=hub.vector.encode())
            self.healthy = True
            self.faults.reconnects += 1

    async def _back_off(
        self, exc: Exception, delays: Iterator[float] | None
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
        elif isinstance(exc, BucketUnavailable) and (
            self.healthy or delay >= self.backoff.maximum / 2
        ):
            log.warning("bucket unreachable, retrying", error=str(exc), delay=round(delay, 3))
        self.healthy = False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):  # wait_for could lose a cancel (Python 3.11)
                await self._stopping.wait()
        return delays

    def _skip_gap(self, s: int, gap: Gap) -> None:
        """The tail fell behind trimming in shard `s`: close whoever has not been sent past
        the horizon."""
        closed = self.hub.skip(s, gap.trimmed)
        self.faults.trim_gaps += 1
        self.faults.items_lost += gap.lost or 0
        log.warning(
            "tail fell behind the trim horizon: items trimmed before they were sent",
            shard=s,
            position=str(gap.position),
            trimmed=str(gap.trimmed),
            lost=gap.lost,
            closed=closed,
        )

    async def _new_history(self, restart: _Restart) -> None:
        """Start over on every shard's log as it now is, under a new epoch if this tail saw a
        rollback (or a shard whose copy of the epoch is gone: it lost its keys)."""
        hub = self.hub
        fault, read = restart.fault, restart.read
        old = hub.epoch
        listeners = len(hub.connections)
        seen = " ".join(map(str, hub.vector.positions))
        rollback = fault.rollback or (read.epoch is None and not self.bucket.log.ordered)
        if rollback:
            await self.bucket.log.renew_epoch(old)
        # The epoch as it now is; created with the bucket if it has none (Redis came back
        # empty), and the partition count checked again.
        epoch = await self.bucket.log.ensure()
        reads = [read] if len(self._shards) == 1 else await self._heads()
        self._restart(reads)
        heads = self.heads
        if rollback:
            self.faults.rollbacks += 1
            log.error(
                "bucket rolled back: Redis lost changes this publisher had seen; new epoch, "
                "every listener must bootstrap again",
                reason=fault.reason, shard=restart.shard, seen=seen,
                head=" ".join(map(str, heads)), old=old, new=epoch,
                listeners=listeners,
            )
        else:
            self.faults.epoch_changes += 1
            log.warning(
                "bucket recreated: new epoch, closing every listener",
                reason=fault.reason, shard=restart.shard, old=old, new=epoch,
                listeners=listeners,
            )
        hub.restart(epoch, heads, rollback=rollback)

    def lag(self) -> tuple[int, float]:
        """How far the tail is behind the bucket's head at its last reads: in items, and in
        seconds of commit time (the largest, over the shards, of the head's Redis time less
        that of the last item read)."""
        if self.unread <= 0:
            return max(self.unread, 0), 0.0
        seconds = max(
            (max(head.ms - at.ms, 0) for head, at in
             zip(self.heads, self.hub.vector.positions, strict=True) if head > at and at != ZERO),
            default=0,
        )
        return self.unread, seconds / 1000

    def stats(self) -> dict[str, Any]:
        """The tail's part of /changefeeds/stats."""
        hub = self.hub
        epoch = hub.epoch
        vector = hub.vector
        out = {
            "healthy": self.healthy,
            "position": vector.encode() if epoch else None,
            "bucketHead": vector.with_positions(self.heads).encode() if epoch else None,
            "itemsBehind": self.unread,
            "secondsBehind": self.lag()[1],
            "trimGaps": self.faults.trim_gaps,
            "itemsLost": self.faults.items_lost,
            "rollbacks": self.faults.rollbacks,
            "epochChanges": self.faults.epoch_changes,
        }
        if vector.composite:
            out["partitions"] = len(vector.positions)
        return out
