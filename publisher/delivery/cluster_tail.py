"""The tail of a bucket in a Redis Cluster: one blocking read per partition, concurrently.

Each partition is read as the single-instance tail reads its log (`ChangeBucket.tail`: an XREAD
BLOCK with tail.lua pipelined behind it, on the master that holds the partition's slot), and
each read is checked with the same pure `assess`, per partition: against the partition's
position in the hub's composite cursor, its copy of the epoch, its head and trimmed horizon.

- a new epoch in any partition (or its copy gone: the partition's keys were lost), or a
  partition rolled back: every listener is closed with 4009 and the hub restarts at every
  partition's head; a rollback (or a partition that lost its keys) starts a new bucket epoch,
  once between the publishers (`ClusterBucket.renew_epoch`), given to every partition;
- a partition trimmed past what the tail had read: every listener is closed with 4009 (each was
  sent at most what the tail had read) and that partition goes on from its horizon.

While any partition cannot be read the tail is unhealthy (new registrations get 1013) and reads
every partition again after a backoff, from the positions it had delivered.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from changefeed.backoff import Backoff
from changefeed.cursor import ZERO
from changefeed.errors import BucketUnavailable, PartitionMismatch
from publisher.bucket import ChangeBucket as ClusterBucket
from publisher.bucket import LogRead, open_bucket
from publisher.bucket import Shard as PartitionBucket
from publisher.config.settings import Config
from publisher.delivery.cluster_hub import ClusterHub
from publisher.delivery.tail import BATCH, BLOCK_MS, Gap, NewHistory, Tail, added_after, assess
from publisher.delivery.window import Window

log = structlog.get_logger(__name__)


class _Restart(Exception):
    """A partition's read showed a new history: every partition starts over."""

    def __init__(self, partition: int, read: LogRead, fault: NewHistory) -> None:
        super().__init__(fault.reason)
        self.partition = partition
        self.read = read
        self.fault = fault


class ClusterTail(Tail):
    """`Tail` for a `ClusterBucket` and its `ClusterHub`: the same surface (run, stop, healthy,
    started, faults, stats, lag), its own reads."""

    def __init__(
        self, bucket: ClusterBucket, hub: ClusterHub, backoff: Backoff | None = None
    ) -> None:
        super().__init__(bucket, hub, backoff)
        self.bucket: ClusterBucket = bucket
        self.hub: ClusterHub = hub
        self._added_of: list[int | None] = []
        self._unread: list[int] = []

    async def _heads(self) -> list[LogRead]:
        parts = await self.bucket.shards()
        return list(await asyncio.gather(*(part.tail(ZERO, None, 0) for part in parts)))

    async def start(self) -> None:
        epoch = await self.bucket.ensure()
        reads = await self._heads()
        self._take_up(reads)
        self.hub.restart(epoch, tuple(read.head for read in reads))
        self.healthy = True
        self.started.set()
        log.info("cluster tail started", epoch=epoch, partitions=len(reads),
                 head=self.hub.vector.encode())

    def _take_up(self, reads: list[LogRead]) -> None:
        self._added_of = [read.added for read in reads]
        self._unread = [0] * len(reads)

    async def run(self) -> None:
        delays = None
        while not self._stopping.is_set():
            try:
                if not self.started.is_set():
                    await self.start()
                    delays = None
                if not await self._follow_all():
                    return
            except _Restart as restart:
                await self._restart_all(restart)
            except (BucketUnavailable, PartitionMismatch) as exc:
                delays = await self._back_off(exc, delays)

    async def _follow_all(self) -> bool:
        """Follow every partition until one fails (raised) or the tail stops (False)."""
        parts = await self.bucket.shards()
        tasks = [asyncio.create_task(self._follow(p, part), name=f"tail partition {p}")
                 for p, part in enumerate(parts)]
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            done, _ = await asyncio.wait([*tasks, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in [*tasks, stopping]:
                if not task.done():
                    # Abandoned, not awaited: a blocked XREAD is not always given up promptly.
                    task.cancel()
                    task.add_done_callback(lambda t: t.cancelled() or t.exception())
        errors = [t.exception() for t in done if t is not stopping and not t.cancelled()]
        for error in errors:
            if error is not None:
                raise error  # what ended a partition's loop (the others' are retrieved)
        return False

    async def _follow(self, p: int, part: PartitionBucket) -> None:
        hub = self.hub
        read_now = True
        while True:
            position = hub.vector.positions[p]
            read = await part.tail(position, None if read_now else BLOCK_MS, BATCH)
            position = hub.vector.positions[p]  # unchanged: only this loop moves it
            fault = assess(read, position, hub.epoch, 1, self._added_of[p])
            read_now = not read.complete
            if isinstance(fault, NewHistory):
                raise _Restart(p, read, fault)
            if isinstance(fault, Gap):
                self._skip_partition_gap(p, fault)
            self._added_of[p] = added_after(read, self._added_of[p], fault)
            hub.heads = hub.heads.advanced(p, read.head)
            added = self._added_of[p]
            self._unread[p] = 0 if added is None or read.added is None else read.added - added
            hub.unread = sum(self._unread)
            if read.entries:
                hub.publish([hub.stamp(p, entry) for entry in read.entries])
            if not self.healthy:
                log.info("bucket reachable again", position=hub.vector.encode())
                self.healthy = True
                self.faults.reconnects += 1

    def _skip_partition_gap(self, p: int, gap: Gap) -> None:
        positions = list(self.hub.vector.positions)
        positions[p] = gap.trimmed
        closed = self.hub.skip_all(tuple(positions))
        self.faults.trim_gaps += 1
        self.faults.items_lost += gap.lost or 0
        log.warning(
            "tail fell behind the trim horizon: items trimmed before they were sent",
            partition=p, position=str(gap.position), trimmed=str(gap.trimmed), lost=gap.lost,
            closed=closed,
        )

    async def _restart_all(self, restart: _Restart) -> None:
        hub = self.hub
        old = hub.epoch
        listeners = len(hub.connections)
        # A partition whose copy of the epoch is gone lost its keys (a shard restarted empty, a
        # replica without them promoted): a rollback of that partition.
        rollback = restart.fault.rollback or restart.read.epoch is None
        if rollback:
            await self.bucket.renew_epoch(old)
        epoch = await self.bucket.ensure()
        reads = await self._heads()
        self._take_up(reads)
        heads = tuple(read.head for read in reads)
        if rollback:
            self.faults.rollbacks += 1
            log.error(
                "bucket rolled back: a partition lost changes this publisher had seen; new "
                "epoch, every listener must bootstrap again",
                partition=restart.partition, reason=restart.fault.reason, old=old, new=epoch,
                listeners=listeners,
            )
        else:
            self.faults.epoch_changes += 1
            log.warning(
                "bucket recreated: new epoch, closing every listener",
                partition=restart.partition, reason=restart.fault.reason, old=old, new=epoch,
                listeners=listeners,
            )
        hub.restart(epoch, heads, rollback=rollback)

    def lag(self) -> tuple[int, float]:
        """Items the tail is behind the partitions' heads at its last reads, and the largest
        gap in commit time (seconds) of any partition."""
        hub = self.hub
        seconds = max(
            (max(head.ms - at.ms, 0) for head, at in
             zip(hub.heads.positions, hub.vector.positions, strict=True)
             if head > at and at != ZERO),
            default=0,
        )
        return max(hub.unread, 0), seconds / 1000

    def stats(self) -> dict[str, Any]:
        hub = self.hub
        epoch = hub.epoch
        return {
            "healthy": self.healthy,
            "position": hub.vector.encode() if epoch else None,
            "bucketHead": hub.heads.encode() if epoch else None,
            "itemsBehind": hub.unread,
            "secondsBehind": self.lag()[1],
            "trimGaps": self.faults.trim_gaps,
            "itemsLost": self.faults.items_lost,
            "rollbacks": self.faults.rollbacks,
            "epochChanges": self.faults.epoch_changes,
            "partitions": len(hub.vector.positions),
        }




def cluster_parts(config: Config) -> tuple[ClusterBucket, ClusterBucket, ClusterHub, ClusterTail]:
    """A publisher's bucket, the tail's own bucket client, hub and tail for a cluster bucket:
    the tail's client blocks on one connection per partition, never behind requests."""
    bucket = config.bucket
    assert bucket.redis_url is not None
    requests = open_bucket(config)
    tails = open_bucket(config, tail=True)
    hub = ClusterHub(
        Window(config.limits.window, ZERO), requests, config.limits.send_buffer, bucket.partitions
    )
    return requests, tails, hub, ClusterTail(tails, hub)


__all__ = ["ClusterTail", "cluster_parts"]
