"""The fan-out of a bucket in a Redis Cluster: the hub, with composite cursors.

The partitions of a cluster bucket have logs of their own, so no single position orders every item.
The cluster tail (`publisher.delivery.cluster_tail`) hands the hub the partitions' entries in the
order it reads them, and the hub stamps each with the composite cursor of *everything this process
has delivered so far* (`vector`: each partition's newest position). That cursor is what the item
carries and what a listener resumes from, on any publisher.

Inside the process the window still needs one order: each entry gets a local position
(`StreamId(newest ms so far, serial)`), which never leaves the process. So `Hub` works unchanged
(routing, the window, slow consumers); what differs is how a connection starts:

- every registration starts at a composite cursor (`start_of`): the `since` it resumes, else the
  newer of each partition's head in Redis and this process's vector;
- `add_at` makes it live at once when that is exactly the vector, else it waits (if this
  publisher's tail is behind the cursor in some partition) until the vector covers it, replays
  from Redis what each partition has between the cursor and the vector (each read checked for
  trimming and the epoch, 4009 when it cannot), then catches up from the window as any lagging
  connection does.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import structlog

from changefeed.cursor import ZERO, CompositeCursor, Cursor, StreamId, parse_cursor
from changefeed.errors import BucketBusy, BucketUnavailable, CursorError
from changefeed.protocol import ChangeItem, CloseCode, text_frame
from changefeed.sse import change_chunk
from publisher.bucket import ChangeBucket as ClusterBucket
from publisher.bucket import LogEntry
from publisher.delivery.hub import RECREATED, REPLAY_BATCH, Hub, Subscriber
from publisher.delivery.window import Window, WindowEntry

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ClusterLogEntry(LogEntry):
    """A partition's entry as the hub sees it: `position` is local to this process, `cursor`
    the composite cursor after it, `published` its commit's Redis time."""

    cursor: str = ""
    published: int = 0

    def item(self, epoch: str) -> ChangeItem:
        return ChangeItem(
            self.resource, self.sub_resources, self.changed_resource_id, self.published,
            self.cursor,
        )


@dataclass(slots=True, eq=False)
class ClusterWindowEntry(WindowEntry):
    cursor: str = ""


class ClusterHub(Hub):
    """`Hub` for a cluster bucket: local positions inside, composite cursors outside."""

    def __init__(
        self, window: Window, bucket: ClusterBucket, send_buffer: int, partitions: int
    ) -> None:
        super().__init__(window, bucket, send_buffer)
        self.cluster = bucket
        self.vector = CompositeCursor("", (ZERO,) * partitions)
        """The composite cursor of the window head: every partition's newest delivered entry."""
        self.heads = self.vector
        """Each partition's head in Redis at the tail's last read of it."""
        self._serial = 0
        self._ms = 0

    # --- positions ---------------------------------------------------------------------------

    def _next_position(self, ms: int) -> StreamId:
        self._serial += 1
        self._ms = max(self._ms, ms)
        return StreamId(self._ms, self._serial)

    def stamp(self, partition: int, entry: LogEntry) -> ClusterLogEntry:
        """`entry` of `partition`, the next one delivered: its local position and cursor."""
        self.vector = self.vector.advanced(partition, entry.position)
        return ClusterLogEntry(
            self._next_position(entry.position.ms), entry.resource, entry.sub_resources,
            entry.changed_resource_id, self.vector.encode(), entry.position.ms,
        )

    def restart(self, epoch: str, heads: tuple[StreamId, ...], *, rollback: bool = False) -> None:
        """A new history: every connection closed with 4009, the vector restarts at `heads`."""
        self.vector = self.heads = CompositeCursor(epoch, heads)
        self.reset(epoch, self._next_position(0), rollback=rollback)

    def skip_all(self, heads: tuple[StreamId, ...]) -> int:
        """A partition was trimmed past what the tail had read: close every connection (4009)
        and go on from `heads` (the vector with that partition moved to its horizon)."""
        self.vector = CompositeCursor(self.epoch, heads)
        return self.skip_to(self._next_position(0))

    # --- encoding ----------------------------------------------------------------------------

    def encode(self, entry: LogEntry) -> WindowEntry:
        cursor = entry.cursor if isinstance(entry, ClusterLogEntry) else ""
        payload = entry.item(self.epoch).encode()
        return ClusterWindowEntry(
            entry.position, entry.resource, entry.sub_resources, entry.changed_resource_id,
            payload, text_frame(payload), cursor=cursor,
        )

    def sse_of(self, entry: WindowEntry) -> bytes:
        chunk = entry.sse
        if chunk is None:
            cursor = entry.cursor if isinstance(entry, ClusterWindowEntry) else ""
            chunk = entry.sse = change_chunk(cursor, entry.payload)
        return chunk

    # --- where a registration starts -----------------------------------------------------------

    async def start_of(self, since: str | None) -> tuple[CompositeCursor, bool]:
        """Where a registration starts, and whether that resumes `since`.

        `since` resumes when it is a composite cursor of this bucket's epoch and partitions and
        each of its positions is within what its partition retains (trimmed <= it <= head).
        Otherwise the stream starts at the newer, per partition, of Redis's head and this
        process's vector (the listener's bootstrap, read after the reply, holds everything up to
        Redis's head)."""
        cursor: CompositeCursor | None = None
        if since is not None:
            try:
                parsed = parse_cursor(since)
            except CursorError:
                parsed = None
            if isinstance(parsed, CompositeCursor):
                cursor = parsed
        epoch = await self.cluster.current_epoch()
        retentions = await self.cluster.retentions()
        current = epoch == self.epoch and all(r.epoch == self.epoch for r in retentions)
        if (
            cursor is not None
            and current
            and cursor.epoch == self.epoch
            and len(cursor.positions) == len(retentions)
            and all(r.trimmed <= at <= r.head
                    for r, at in zip(retentions, cursor.positions, strict=True))
        ):
            return cursor, True
        if not current:
            return self.vector, False
        heads = tuple(max(r.head, at) for r, at in zip(retentions, self.vector.positions,
                                                        strict=True))
        return CompositeCursor(self.epoch, heads), False

    def add_at(self, conn: Subscriber, start: CompositeCursor) -> None:
        """Register `conn` to be sent everything after `start` (see the module's docstring)."""
        if start == self.vector:
            self.add(conn)
            return
        self.connections.add(conn)
        self.routes.add(conn)
        conn.live = False
        conn.replaying = True  # not closed as slow while it replays from Redis
        conn.position = self.window.head
        self._lagging.add(conn)
        conn.task = asyncio.create_task(self._resume(conn, start), name=f"resume {conn.remote}")

    async def _resume(self, conn: Subscriber, start: CompositeCursor) -> None:
        try:
            epoch = self.epoch
            while not self.vector.covers(start) and not conn.closing:
                # A cursor from a publisher whose tail is ahead of ours: wait for ours.
                if self.epoch != epoch:
                    break
                await self._advanced.wait()
            if conn.closing:
                return
            if self.epoch != epoch or start.epoch != self.epoch:
                self.closed["epochChange"] += 1
                self.close_now(conn, CloseCode.BUCKET_RESET, RECREATED)
                return
            while True:
                # Replay from Redis up to this process's vector, then go on from the window;
                # if the window moved past that point meanwhile, replay again up to the new one.
                until, position = self.vector, self.window.head
                if not await self._replay_partitions(conn, start, until):
                    return
                if self.epoch != start.epoch:
                    self.closed["epochChange"] += 1
                    self.close_now(conn, CloseCode.BUCKET_RESET, RECREATED)
                    return
                if self.window.covers(position):
                    break
                log.debug("resume outrun by the window: replaying again", remote=conn.remote)
                start = until
            conn.position = position
            conn.replaying = False  # from here it is a lagging connection like any other
            await self._catch_up(conn)  # checks the window before it first awaits
        except (ConnectionError, RuntimeError) as exc:
            log.info("resume ended: connection gone", remote=conn.remote, error=str(exc))
        except BucketBusy as exc:
            log.warning("resume failed: publisher overloaded", remote=conn.remote, error=str(exc))
            self.close_now(conn, CloseCode.OVERLOADED, "publisher overloaded during replay")
        except BucketUnavailable as exc:
            log.warning("resume failed: bucket unavailable", remote=conn.remote, error=str(exc))
            self.close_now(conn, CloseCode.TRY_AGAIN_LATER, "bucket unavailable during replay")

    async def _replay_partitions(
        self, conn: Subscriber, start: CompositeCursor, until: CompositeCursor
    ) -> bool:
        """Send `conn` each partition's matching entries in (start, until], partition by
        partition (order is per partition), each stamped with the composite cursor after it.
        False when the connection was closed (trimmed past its position, a new epoch)."""
        vector = start
        parts = await self.cluster.shards()
        for p, part in enumerate(parts):
            position, end = start.positions[p], until.positions[p]
            while position < end and not conn.closing:
                read = await part.tail(position, None, REPLAY_BATCH)
                if read.epoch != self.epoch:
                    self.closed["epochChange"] += 1
                    self.close_now(conn, CloseCode.BUCKET_RESET, RECREATED)
                    return False
                if read.trimmed > position:
                    self.close_trimmed(conn)
                    return False
                rows = [row for row in read.entries if row.position <= end]
                if not rows:
                    break
                for row in rows:
                    vector = vector.advanced(p, row.position)
                    if conn.wants(row):
                        if not await self._writable(conn):
                            return False
                        cursor = vector.encode()
                        payload = ChangeItem(row.resource, row.sub_resources,
                                             row.changed_resource_id, row.position.ms,
                                             cursor).encode()
                        frame = change_chunk(cursor, payload) if conn.sse else text_frame(payload)
                        conn.transport.write(frame)
                        self.delivered += 1
                        self.bytes_written += len(frame)
                    position = row.position
        return not conn.closing

    # --- reporting ---------------------------------------------------------------------------

    def stats(self, publisher_id: str) -> list[dict[str, Any]]:
        out = super().stats(publisher_id)
        head = self.heads.encode() if self.epoch else None
        sent = {e.position: e.cursor for e in self.window.after(ZERO)
                if isinstance(e, ClusterWindowEntry)}
        for row in out:
            row["headCursor"] = head
            last = row.get("lastCursorSent")
            if last is not None:
                row["lastCursorSent"] = sent.get(Cursor.decode(last).position)
        return out


__all__ = ["ClusterHub", "ClusterLogEntry", "ClusterWindowEntry"]
