"""The relay: moves outbox rows into the bucket, exactly once, in commit order per id.

One relay at a time: a publisher relays while it holds the outbox's session-level advisory lock
on its dedicated connection; the others try for it every `takeoverInterval` seconds
and take over within that of the holder's death (its session ends, the lock goes with it).

A round claims the oldest rows not claimed yet as one batch (it writes the batch's number, its
first row id, into the rows: publisher.outbox.rows.CLAIM), moves the dead ones to outbox_dead,
commits the others with `commit_many` under the idempotency key the batch's number names, and
only then deletes them, recording their cursors, in one statement. A relay killed between the
commit and the delete leaves the claimed rows; its successor sends the very same batch again
first, under the same key, and the bucket, knowing it, writes nothing and answers the first
cursors. Rows are removed once relayed, so a row whose transaction took a lower id but
committed after a higher one is claimed by the next batch (no `id > last seen`).

Woken by LISTEN (a connection of its own: losing it loses no lock) within a millisecond of a
commit, and by the poll every `pollInterval` seconds when no notification comes. A commit that
comes back in another epoch than the last one means the bucket lost what it held (Redis
restarted empty, restored from an older snapshot): the store is re-seeded from PostgreSQL
before the next batch (publisher.outbox.seed).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from changefeed.cursor import Position
from changefeed.errors import BucketUnavailable, ChangeError, OutboxError
from changefeed.protocol import Resource
from publisher.bucket import Change, ChangeBucket
from publisher.config.outbox import Outbox
from publisher.outbox import database, schema
from publisher.outbox.database import translate_postgres_errors
from publisher.outbox.rows import (
    CLAIM,
    CLAIMED,
    Batch,
    Dead,
    Row,
    batches,
    key_of,
    refused,
    sort_rows,
)
from publisher.outbox.seed import reseed
from publisher.outbox.status import Status, read_status

log = structlog.get_logger(__name__)

RELAYED = """
WITH gone AS (DELETE FROM changefeed.outbox WHERE id = ANY($1::bigint[]))
INSERT INTO changefeed.outbox_relayed (id, cursor)
SELECT * FROM unnest($1::bigint[], $2::text[]) ON CONFLICT (id) DO NOTHING
"""
BURIED = """
WITH gone AS (DELETE FROM changefeed.outbox WHERE id = ANY($1::bigint[]) RETURNING *)
INSERT INTO changefeed.outbox_dead
    (id, resource, changed_id, sub_resources, op, state, created, reason)
SELECT g.id, g.resource, g.changed_id, g.sub_resources, g.op, g.state, g.created, r.reason
FROM gone g JOIN unnest($1::bigint[], $2::text[]) AS r(id, reason) USING (id)
ON CONFLICT (id) DO NOTHING
"""
BOUND_DEAD = """
DELETE FROM changefeed.outbox_dead WHERE id IN
    (SELECT id FROM changefeed.outbox_dead ORDER BY id DESC OFFSET $1)
"""
FORGET_RELAYED = """
DELETE FROM changefeed.outbox_relayed
WHERE relayed < now() - make_interval(secs => $1::double precision)
"""
HOUSEKEEPING = 5.0
"""Seconds between two status reads and prunings of outbox_relayed by the relaying publisher."""
BACKOFF = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
"""Seconds between attempts after PostgreSQL or the bucket failed (the last repeats)."""


@dataclass(slots=True)
class RelayStats:
    """What `/metrics` and `/changefeeds/stats` show of the relay."""

    relaying: bool = False
    """This publisher holds the relay lock."""
    listening: bool = False
    """LISTEN is up (else only the poll wakes the relay)."""
    relayed: int = 0
    dead: int = 0
    reseeds: int = 0
    postgres_errors: int = 0
    bucket_errors: int = 0
    status: Status | None = None
    """The outbox's last status read (backlog, oldest age, relaying session, dead rows)."""
    status_at: float = 0.0

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "relaying": self.relaying, "listening": self.listening, "relayed": self.relayed,
            "dead": self.dead, "reseeds": self.reseeds, "postgresErrors": self.postgres_errors,
            "bucketErrors": self.bucket_errors,
        }
        if self.status is not None:
            out.update(self.status.report())
        return out


async def cancelled(tasks: Sequence[asyncio.Task[None]]) -> None:
    """Cancel `tasks` and wait until they end (each within database.CLOSE_TIMEOUT: closing
    its connection is all that is left of it). Their ends are theirs, not raised; a
    cancellation of the caller's own meanwhile is raised once they ended (suppressing
    CancelledError around `await task` swallowed it: a stopping relay started over)."""
    for task in tasks:
        task.cancel()
    pending = set(tasks)
    interrupted: asyncio.CancelledError | None = None
    while pending:
        try:
            _, pending = await asyncio.wait(pending)
        except asyncio.CancelledError as exc:
            interrupted = exc
    if interrupted is not None:
        raise interrupted


class Relay:
    """Relays the outbox named by `config` into `bucket` while this publisher holds the lock.

    >>> relay = Relay(bucket, config.outbox, config.resource_map, config.outbox.url(), "pub-1")
    >>> task = asyncio.create_task(relay.run()); ...; await relay.stop()
    """

    def __init__(
        self, bucket: ChangeBucket, config: Outbox, resources: Mapping[str, Resource],
        url: str, name: str,
    ) -> None:
        self.bucket = bucket
        self.config = config
        self.resources = dict(resources)
        self.url = url
        self.name = name
        self.stats = RelayStats()
        self.epoch: str | None = None
        """The bucket epoch of the relay's last commit (None: none yet)."""
        self._lost = False
        """A commit came back in another epoch: re-seed before the next batch."""
        self.resync_asked: set[str] = set()
        """Resources a `changefeed outbox resync` asked to re-seed ('' names every one)."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.on_relayed: Callable[[Sequence[tuple[Row, str]]], None] | None = None
        """Called with (row, cursor) of each round's relayed rows (tests, benchmarks)."""

    async def run(self) -> None:
        """Relay (or stand by) until cancelled, reconnecting after PostgreSQL failures."""
        failures = 0
        while True:
            try:
                await self._session()
            except OutboxError as exc:
                self.stats.postgres_errors += 1
                (log.warning if failures == 0 else log.debug)(
                    "outbox: PostgreSQL unavailable, retrying", error=str(exc),
                    postgres=self.config.display_url,
                )
            except Exception:  # a bug of ours or a driver's: loudly, and the relay goes on
                self.stats.postgres_errors += 1
                log.exception("outbox: the relay failed; starting over")
            finally:
                self.stats.relaying = self.stats.listening = False
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # asked to stop as the session failed
                raise asyncio.CancelledError()  # (and something below swallowed it): stop
            await asyncio.sleep(BACKOFF[min(failures, len(BACKOFF) - 1)])
            failures += 1

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.create_task(self.run(), name="outbox-relay")
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})  # a cancellation of the caller's own goes through
            self._task = None

    async def _session(self) -> None:
        """One session: wait for the lock, then relay until the connection fails."""
        conn = await database.connect(self.url, self.name)
        helpers: list[asyncio.Task[None]] = []
        try:
            async with translate_postgres_errors("outbox relay lock"):
                await self._take_lock(conn)
                install_id = await conn.fetchval(
                    "SELECT install_id::text FROM changefeed.outbox_schema"
                )
            if install_id is None:
                raise OutboxError("the outbox is not installed: run `changefeed outbox install`")
            self.stats.relaying = True
            log.info("outbox: relaying", publisher=self.name, postgres=self.config.display_url)
            helpers = [asyncio.create_task(self._listen(), name="outbox-listen"),
                       asyncio.create_task(self._housekeep(), name="outbox-housekeeping")]
            await self._relay(conn, install_id)
        finally:
            try:
                await cancelled(helpers)
            finally:
                await database.close(conn)

    async def _take_lock(self, conn: Any) -> None:
        """Return once this session holds the relay lock: a standby tries every
        `takeoverInterval` seconds (pg_advisory_lock's wait would hold a statement open that
        no cancellation of ours could end cleanly)."""
        while True:
            if await conn.fetchval(
                "SELECT pg_try_advisory_lock($1, $2)", schema.LOCK_CLASS, schema.RELAY_LOCK
            ):
                return
            await asyncio.sleep(self.config.takeover_interval)

    async def _listen(self) -> None:
        """Keep a LISTEN connection up; every notification wakes the relay."""
        failures = 0
        while True:
            lost = asyncio.Event()
            try:
                conn = await database.connect(self.url, self.name, database.LISTENING)
                try:
                    conn.add_termination_listener(lambda _, lost=lost: lost.set())
                    async with translate_postgres_errors("outbox LISTEN"):
                        await conn.add_listener(schema.CHANNEL, self._notified)
                    self.stats.listening = True
                    failures = 0
                    self._wake.set()  # what was committed while not listening
                    await lost.wait()
                finally:
                    self.stats.listening = False
                    await database.close(conn)
                log.warning("outbox: LISTEN connection lost; the poll relays meanwhile")
            except OutboxError as exc:
                log.debug("outbox: LISTEN connection failed", error=str(exc))
            await asyncio.sleep(BACKOFF[min(failures + 3, len(BACKOFF) - 1)])
            failures += 1

    def _notified(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        if payload.startswith(schema.RESYNC):
            self.resync_asked.add(payload.removeprefix(schema.RESYNC).lstrip(":"))
        self._wake.set()

    def wake(self) -> None:
        """Relay a round now (as a notification would)."""
        self._wake.set()

    async def _relay(self, conn: Any, install_id: str) -> None:
        """Relay batches until the session fails: first those a relay that died claimed, then
        new ones; between them, a re-seed when the bucket lost its state or one was asked."""
        async with translate_postgres_errors("outbox read"):
            pending = batches(await conn.fetch(CLAIMED))
        failures = 0
        while True:
            self._wake.clear()
            full = False
            try:
                if self._lost or self.resync_asked:
                    await self._reseed(conn)
                if not pending:
                    async with translate_postgres_errors("outbox claim"):
                        claimed = await conn.fetch(CLAIM, self.config.batch)
                    pending = batches(claimed)
                    full = len(claimed) >= self.config.batch
                if pending:
                    await self._send(conn, install_id, pending[0])
                    pending.pop(0)
            except BucketUnavailable as exc:
                self.stats.bucket_errors += 1
                (log.warning if failures == 0 else log.debug)(
                    "outbox: bucket unavailable; the rows wait in PostgreSQL", error=str(exc)
                )
                await asyncio.sleep(BACKOFF[min(failures, len(BACKOFF) - 1)])
                failures += 1
                continue
            failures = 0
            if pending or full:
                continue  # more wait
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.poll_interval):  # not wait_for: before
                    await self._wake.wait()  # 3.12 it dropped a cancellation racing the wake

    async def _send(self, conn: Any, install_id: str, batch: Batch) -> None:
        """Commit `batch` under its key, set its dead rows aside, and remove what it relayed
        (recording the cursors), in that order."""
        relay, dead = sort_rows(batch.records, self.resources)
        relayed, refusals = await self._commit(relay, key_of(install_id, batch.id))
        dead += refusals
        async with translate_postgres_errors("outbox removal"):
            if dead:
                await self._bury(conn, dead)
            if relayed:
                await conn.execute(
                    RELAYED, [row.id for row, _ in relayed], [cursor for _, cursor in relayed]
                )
        self.stats.relayed += len(relayed)
        if relayed:
            epoch = Position.decode(relayed[-1][1]).epoch
            if self.epoch is not None and epoch != self.epoch:
                self._lost = True  # the bucket lost its state (or was rolled back): re-seed
            else:
                self.epoch = epoch
            if self.on_relayed is not None:
                self.on_relayed(relayed)

    async def _commit(
        self, relay: Sequence[tuple[Row, Change]], key: str
    ) -> tuple[list[tuple[Row, str]], list[Dead]]:
        """Commit the changes of a batch atomically under `key`: (row, cursor) of each, and the
        rows the bucket refused. A batch the bucket refuses whole (its key known for other
        changes: config.js changed the batch's dead rows between two tries, or the outbox was
        restored from an older backup) is committed row by row, each under a key of its own."""
        if not relay:
            return [], []
        try:
            cursors = await self.bucket.commit_many([change for _, change in relay], key=key)
        except ChangeError as exc:
            log.error("outbox: the bucket refused a batch; relaying its rows one by one",
                      key=key, error=str(exc))
        else:
            return [(row, cursor) for (row, _), cursor in zip(relay, cursors, strict=True)], []
        relayed: list[tuple[Row, str]] = []
        dead: list[Dead] = []
        for row, change in relay:
            try:
                (cursor,) = await self.bucket.commit_many([change], key=f"{key}/{row.id}")
            except ChangeError as exc:
                dead.append(refused(exc, row))
                continue
            relayed.append((row, cursor))
        return relayed, dead

    async def _bury(self, conn: Any, dead: Sequence[Dead]) -> None:
        await conn.execute(
            BURIED, [d.row.id for d in dead], [d.reason for d in dead]
        )
        await conn.execute(BOUND_DEAD, self.config.max_dead_rows)
        self.stats.dead += len(dead)
        for d in dead:
            log.error(
                "outbox: dead row moved to changefeed.outbox_dead", row=d.row.id,
                resource=d.row.resource, id=d.row.changed_id, reason=d.reason,
            )

    async def _reseed(self, conn: Any) -> None:
        """Re-seed the store: every resource when the bucket lost its state (its new epoch is
        every listener's Resync already), else those asked (then a new epoch: one Resync)."""
        lost, asked = self._lost, set(self.resync_asked)
        only = None if lost or "" in asked else asked
        log.warning("outbox: re-seeding the store from PostgreSQL",
                    reason="the bucket lost its state" if lost else "asked",
                    resources=sorted(only or self.resources))
        self.epoch = await reseed(conn, self.bucket, self.config, self.resources, only,
                                  renew=not lost)
        self._lost = False
        self.resync_asked -= asked
        self.stats.reseeds += 1

    async def _housekeep(self) -> None:
        """While relaying, every HOUSEKEEPING seconds, on a connection of its own (a large
        pruning never holds a batch up): forget the cursors older than `keepRelayed`, and read
        the outbox's status for /metrics and /changefeeds/stats."""
        conn: Any = None
        try:
            while True:
                try:
                    if conn is None:
                        conn = await database.connect(self.url, self.name, database.HOUSEKEEPING)
                    async with translate_postgres_errors("outbox housekeeping"):
                        await conn.execute(FORGET_RELAYED, self.config.keep_relayed)
                        self.stats.status = await read_status(conn)
                    self.stats.status_at = time.time()
                except OutboxError as exc:
                    log.debug("outbox: housekeeping failed", error=str(exc))
                    if conn is not None:
                        await database.close(conn)
                    conn = None
                await asyncio.sleep(HOUSEKEEPING)
        finally:
            if conn is not None:
                await database.close(conn)
