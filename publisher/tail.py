"""The tail: one blocking read loop per publisher process, feeding the hub.

It reads the log with XREAD BLOCK (no polling interval) from the last position it delivered, so
after a Redis outage it resumes exactly there and skips nothing. While Redis is unreachable it
retries with exponential backoff and jitter and reports itself unhealthy (new registrations are
refused with 1013). A changed epoch means the bucket was recreated: the hub is reset.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from changefeed.backoff import Backoff
from changefeed.cursor import ZERO
from changefeed.errors import BucketUnavailable, PartitionMismatch
from publisher.bucket import ChangeBucket, LogEntry
from publisher.hub import Hub

log = structlog.get_logger(__name__)

BLOCK_MS = 5000
"""Longest single XREAD wait; the read returns at once when an item arrives."""
BATCH = 1000


class Tail:
    def __init__(self, bucket: ChangeBucket, hub: Hub, backoff: Backoff | None = None) -> None:
        self.bucket = bucket
        self.hub = hub
        self.backoff = backoff or Backoff(initial=0.05, maximum=5.0)
        self.healthy = False
        self.started = asyncio.Event()
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Make run() return. A blocked XREAD is abandoned, not awaited: redis-py does not
        always give up a blocked read promptly when cancelled."""
        self._stopping.set()

    async def _read(self) -> list[LogEntry] | None:
        """The next entries, or None when stopping."""
        read = asyncio.ensure_future(self.bucket.tail(self.hub.window.head, BLOCK_MS, BATCH))
        stopping = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({read, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if read.done():
            stopping.cancel()
            return read.result()
        read.cancel()
        read.add_done_callback(lambda task: task.cancelled() or task.exception())
        return None

    async def start(self) -> None:
        """Learn the epoch and the log head; the window starts there."""
        epoch = await self.bucket.ensure()
        retention = await self.bucket.retention()
        self.hub.reset(epoch, retention.head)
        self.healthy = True
        self.started.set()
        log.info("tail started", epoch=epoch, head=str(retention.head))

    async def run(self) -> None:
        delays = None
        while not self._stopping.is_set():
            try:
                if not self.started.is_set():
                    await self.start()
                    delays = None
                elif not self.healthy:
                    epoch = await self.bucket.current_epoch()
                    log.info("bucket reachable again", position=str(self.hub.window.head))
                    self.healthy = True
                    delays = None
                    if epoch != self.hub.epoch:
                        await self._bucket_recreated(epoch)
                entries = await self._read()
                if entries is None:
                    return
                # Checked after every read: entries of a recreated bucket must never be
                # labelled with the old epoch.
                epoch = await self.bucket.current_epoch()
                if epoch != self.hub.epoch:
                    await self._bucket_recreated(epoch)
                elif entries:
                    self.hub.publish(entries)
            except (BucketUnavailable, PartitionMismatch) as exc:
                # A partition mismatch is a configuration fault: said loudly on every retry
                # until the operator mends the config (registrations are refused meanwhile).
                if delays is None:
                    delays = self.backoff.delays()
                delay = next(delays)
                if isinstance(exc, PartitionMismatch):
                    log.error("bucket.partitions does not match the bucket", error=str(exc))
                elif self.healthy or delay >= self.backoff.maximum / 2:
                    log.warning(
                        "bucket unreachable, retrying", error=str(exc), delay=round(delay, 3)
                    )
                self.healthy = False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), delay)

    async def _bucket_recreated(self, epoch: str | None) -> None:
        if epoch is None:
            epoch = await self.bucket.ensure()
        log.warning(
            "bucket recreated: new epoch, closing every listener",
            old=self.hub.epoch,
            new=epoch,
            listeners=len(self.hub.connections),
        )
        self.hub.reset(epoch, ZERO)
