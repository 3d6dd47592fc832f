"""What the capture tests share: the server settings logical replication needs, a fresh
database per test, and SQL run on a plain psycopg2 connection."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import psycopg2

from changefeed.cursor import Position, StreamId
from faults.oracle import History
from faults.records import Attempt, Outcome
from publisher.bucket import ChangeBucket, LogEntry
from publisher.capture import database
from publisher.capture import pgoutput as po
from publisher.capture.install import install
from publisher.config.capture import Capture, parse_capture

LOGICAL = {
    "wal_level": "logical", "max_replication_slots": "20", "max_wal_senders": "20",
    "wal_sender_timeout": "10s",
}
"""What the capture needs of the server (more slots and senders than tests use at once)."""
_names = itertools.count()


def fresh_database(admin_url: str) -> str:
    """A new, empty database; returns its URL."""
    name = f"c{next(_names)}_{int(time.time() * 1000) % 100000}"
    conn = psycopg2.connect(admin_url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
    finally:
        conn.close()
    return admin_url.rsplit("/", 1)[0] + "/" + name


def sql(url: str, *statements: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run `statements` in one transaction; the rows of the last one (or [])."""
    conn = psycopg2.connect(url)
    try:
        with conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement, args or None)
            return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()


VMS = ("CREATE TABLE vms (uuid text PRIMARY KEY, seq int NOT NULL, nics jsonb, alias text, "
       "big text)")
"""The test table: `vm` resources, their state the row ({"uuid", "seq", ...}: what the fault
suite's listener recorder reads)."""
MAPPING = {"resource": "vm", "id": "uuid",
           "subResources": {"nic": ["nics"], "alias": ["alias"], "state": ["seq"]}}


def capture_section(url: str, **extra: Any) -> dict[str, Any]:
    """config.js's `capture` for the tests: quick takeover and status, the vms table."""
    section: dict[str, Any] = {"postgres": url, "takeoverInterval": 0.2, "statusInterval": 0.2,
                               "tables": {"public.vms": MAPPING}}
    section.update(extra)
    return section


def prepare(url: str, *statements: str, tables: dict[str, Any] | None = None,
            resources: dict[str, list[str]] | None = None) -> Capture:
    """The vms table (and `statements`), and the publication `changefeed capture install`
    makes; returns the capture's config (slot named after the database; `tables` instead of
    the vms table's mapping, for `resources` instead of the vm resource)."""
    sql(url, VMS, *statements)
    name = url.rsplit("/", 1)[1]
    section = capture_section(url, slot=f"s_{name}", publication=f"p_{name}")
    if tables is not None:
        section["tables"] = tables
    known = resources if resources is not None else {"vm": ["nic", "alias", "state"]}
    capture = parse_capture({"capture": section}, known, "test", Path.cwd())
    assert capture is not None
    conn = database.connect(url)
    try:
        install(conn, capture)
    finally:
        conn.close()
    return capture


def section_of(capture: Capture, url: str, tables: dict[str, Any] | None = None
               ) -> dict[str, Any]:
    section = capture_section(url, slot=capture.slot, publication=capture.publication)
    if tables is not None:
        section["tables"] = tables
    return section


@dataclass(slots=True)
class Written:
    """A committed row change: its id, seq, and an interval of WAL positions its commit record
    lies in (`lo` < commit LSN < `hi`)."""

    id: str
    seq: int
    lo: int
    hi: int
    stamp: int
    """The history's clock when the commit was acknowledged (the oracle orders by it)."""
    time: float


@dataclass
class Writer:
    """Commits `vms` rows as a service would (asyncpg), recording what committed."""

    url: str
    history: History = field(default_factory=History)
    seq: int = 0
    committed: list[Written] = field(default_factory=list)
    rolled_back: list[tuple[str, int]] = field(default_factory=list)
    conn: Any = None

    async def commit(self, ids: Sequence[str], *, rollback: bool = False,
                     alias: str | None = None) -> None:
        """One transaction upserting each of `ids` with the next seq."""
        if self.conn is None:
            self.conn = await asyncpg.connect(self.url)
        made = []
        async with self.conn.transaction() as _:
            lo = po.parse_lsn(await self.conn.fetchval("SELECT pg_current_wal_insert_lsn()::text"))
            for id in ids:
                self.seq += 1
                await self.conn.execute(
                    "INSERT INTO vms (uuid, seq, alias) VALUES ($1, $2, $3) ON CONFLICT (uuid) "
                    "DO UPDATE SET seq = EXCLUDED.seq, alias = coalesce($3, vms.alias)",
                    id, self.seq, alias)
                made.append((id, self.seq))
            if rollback:
                self.rolled_back += made
                raise _Rollback()
        hi = po.parse_lsn(await self.conn.fetchval("SELECT pg_current_wal_insert_lsn()::text"))
        now = time.monotonic()
        self.committed += [Written(id, seq, lo, hi, self.history.tick(), now)
                           for id, seq in made]

    async def run(self, stop: asyncio.Event, ids: int = 20, pace: float = 0.002) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            await self.commit([f"vm-{n % ids:03}"])
            await asyncio.sleep(pace)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()


class _Rollback(Exception):
    pass


async def rollback(writer: Writer, ids: Sequence[str]) -> None:
    with contextlib.suppress(_Rollback):
        await writer.commit(ids, rollback=True)


async def stream_entries(bucket: ChangeBucket, head: str) -> list[LogEntry]:
    """Every log entry after `head` (a capture mark's: the stream's, after the copy)."""
    after = StreamId.parse(head) if head else StreamId(0, 0)
    out: list[LogEntry] = []
    while True:
        read = await bucket.log.read(after, None, 5000)
        out += read
        if len(read) < 5000:
            return out
        after = read[-1].position


def account(written: Sequence[Written], entries: Sequence[LogEntry], copy_lsn: int,
            history: History | None = None, epoch: str = "") -> list[str]:
    """Every change committed after the copy's consistent point in the stream once, in commit
    order per id, and none committed before it (a commit whose interval holds the point may be
    on either side). With `history`, each is recorded as acknowledged at its log cursor, for
    the listeners' verdict."""
    problems = []
    by_id: dict[str, list[Written]] = {}
    for w in written:
        by_id.setdefault(w.id, []).append(w)
    logged: dict[str, list[LogEntry]] = {}
    for entry in entries:
        logged.setdefault(entry.changed_resource_id, []).append(entry)
    for id in sorted(set(by_id) | set(logged)):
        commits, got = by_id.get(id, []), logged.get(id, [])
        after = [w for w in commits if w.lo >= copy_lsn]
        either = [w for w in commits if w.lo < copy_lsn < w.hi]
        if not len(after) <= len(got) <= len(after) + len(either):
            problems.append(f"{id}: {len(after)} (+{len(either)} at the seam) committed after "
                            f"the copy, {len(got)} in the log")
            continue
        if history is not None:
            for w, entry in zip(commits[len(commits) - len(got):], got, strict=True):
                cursor = Position.single(epoch, entry.position).encode()
                history.attempts.append(Attempt(id, w.seq, Outcome.ACKNOWLEDGED, cursor,
                                                w.stamp, w.time))
    if history is not None:
        history.attempts.sort(key=lambda a: a.stamp)
    return problems
