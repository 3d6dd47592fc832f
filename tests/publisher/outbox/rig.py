"""What the outbox tests share: a fresh database per test with the outbox installed and a `vms`
table, a service-like writer that commits `vms` rows and outbox rows in one transaction, and the
accounting of faults/oracle.py fed from it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from faults.harness import FAST, Recorder
from faults.oracle import History
from faults.records import Attempt, Outcome
from listener import Listener
from publisher import outbox
from publisher.outbox.database import ERRORS
from publisher.outbox.schema import install
from tests.servers import scaled

RESOURCE = "vm"
SUBS = ["state"]
SNAPSHOT = "SELECT uuid, state FROM vms"
_names = itertools.count()
DRIVER_ERRORS = ERRORS
"""What a writer's transaction may fail with when PostgreSQL goes away."""


async def fresh_database(admin_url: str) -> str:
    """A new database with the outbox installed and a `vms` table; returns its URL."""
    name = f"t{next(_names)}_{int(time.time() * 1000) % 100000}"
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    url = admin_url.rsplit("/", 1)[0] + "/" + name
    conn = await asyncpg.connect(url)
    try:
        await install(conn)
        await conn.execute("CREATE TABLE vms (uuid text PRIMARY KEY, state jsonb NOT NULL)")
    finally:
        await conn.close()
    return url


def outbox_section(url: str, **extra: Any) -> dict[str, Any]:
    """config.js's `outbox` for the tests: a fast poll and takeover, the vms snapshot."""
    section: dict[str, Any] = {
        "postgres": url, "pollInterval": 0.2, "takeoverInterval": 0.2,
        "resources": {RESOURCE: {"snapshot": SNAPSHOT}},
    }
    section.update(extra)
    return section


@dataclass(slots=True)
class Committed:
    id: str
    seq: int
    row: int
    stamp: int
    time: float


@dataclass
class PgWriter:
    """Commits `vm` changes of `ids` VMs the way a service would: UPDATE its `vms` row and
    `outbox.put` in one transaction. Records every transaction's outcome; the cursors are
    resolved at the end (`resolve`) from changefeed.outbox_relayed."""

    url: str
    history: History
    ids: int = 20
    seq: int = 0
    committed: list[Committed] = field(default_factory=list)
    failed: int = 0
    conn: Any = None
    paused: bool = False
    """While True, `run` commits nothing."""

    async def connect(self) -> None:
        self.conn = await asyncpg.connect(self.url)

    async def commit(self, count: int = 1) -> list[Committed]:
        """One transaction of `count` changes; [] when it failed (reconnecting for the next)."""
        if self.conn is None or self.conn.is_closed():
            try:
                await self.connect()
            except DRIVER_ERRORS:
                self.failed += 1
                return []
        made = []
        committing = False
        try:
            tx = self.conn.transaction()
            await tx.start()
            try:
                for _ in range(count):
                    self.seq += 1
                    id = f"vm-{self.seq % self.ids:03}"
                    state = {"uuid": id, "seq": self.seq}
                    await self.conn.execute(
                        "INSERT INTO vms VALUES ($1, $2::jsonb) ON CONFLICT (uuid) DO UPDATE "
                        "SET state = EXCLUDED.state", id, _json(state))
                    row = await outbox.put(self.conn, RESOURCE, id, SUBS, state)
                    made.append((id, self.seq, row))
            except BaseException:
                if not self.conn.is_closed():
                    with contextlib.suppress(*DRIVER_ERRORS):
                        await asyncio.wait_for(tx.rollback(), 1)
                raise
            committing = True
            await tx.commit()
        except DRIVER_ERRORS:
            self.failed += 1
            now = time.monotonic()
            for id, seq, _ in made:  # a COMMIT without an answer may have committed
                (self.history.unknown if committing else self.history.failed)(id, seq, now)
            self.conn = None
            return []
        now = time.monotonic()
        done = [Committed(id, seq, row, self.history.tick(), now) for id, seq, row in made]
        self.committed += done
        return done

    @property
    def last(self) -> Committed:
        return self.committed[-1]

    async def run(self, stop: asyncio.Event, pace: float = 0.005) -> None:
        while not stop.is_set():
            if self.paused:
                await asyncio.sleep(0.01)
                continue
            if not await self.commit():
                await asyncio.sleep(0.05)
            await asyncio.sleep(pace)

    async def resolve(self) -> list[Committed]:
        """Record every committed change in the history with its cursor (from the relay's
        record); returns those that were never relayed."""
        conn = await asyncpg.connect(self.url)
        try:
            cursors = dict(await conn.fetch("SELECT id, cursor FROM changefeed.outbox_relayed"))
        finally:
            await conn.close()
        missing = []
        for c in self.committed:
            cursor = cursors.get(c.row)
            if cursor is None:
                missing.append(c)
                continue
            self.history.attempts.append(
                Attempt(c.id, c.seq, Outcome.ACKNOWLEDGED, cursor, c.stamp, c.time)
            )
        self.history.attempts.sort(key=lambda a: a.stamp)
        return missing

    async def close(self) -> None:
        if self.conn is not None and not self.conn.is_closed():
            await self.conn.close()


def _json(value: Any) -> str:
    import orjson

    return orjson.dumps(value).decode()


def per_id_order(history: History) -> list[str]:
    """Ids whose changes a listener delivered out of their commit order."""
    seq_of = {a.cursor: a.seq for a in history.acked}
    bad = []
    for name, log in history.listeners.items():
        newest: dict[str, int] = {}
        for change in log.changes:
            seq = seq_of.get(change.cursor)
            if seq is None:
                continue
            if seq < newest.get(change.id, -1):
                bad.append(f"{name}: {change.id}")
            newest[change.id] = max(seq, newest.get(change.id, -1))
    return bad


def recorder(history: History, name: str, url: str | Sequence[str]) -> Recorder:
    """A started Listener of every `vm` change at publisher `url`, recorded in `history`."""
    listener = Listener(url, instance=f"{name}-instance", service="outbox",
                        resources={RESOURCE: ["*"]}, config=FAST)
    made = Recorder(history.listener(name), listener)
    made.start()
    return made


async def received(rec: Recorder, count: int, within: float = 10) -> None:
    """Wait until `rec` delivered `count` changes."""
    if not await rec.wait(lambda: len(rec.log.changes) >= count, within):
        raise AssertionError(
            f"{rec.log.name} delivered {len(rec.log.changes)} of {count} changes "
            f"({rec.failure!r})"
        )


async def until(predicate: Callable[[], bool], what: str, within: float = 20) -> None:
    """Wait until `predicate()` holds (a writer's progress), failing after `within` seconds."""
    deadline = time.monotonic() + scaled(within)
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.01)


async def drained(url: str, within: float = 20) -> None:
    """Wait until the outbox has no row waiting."""
    conn = await asyncpg.connect(url)
    try:
        deadline = time.monotonic() + scaled(within)
        while await conn.fetchval("SELECT count(*) FROM changefeed.outbox"):
            if time.monotonic() > deadline:
                raise AssertionError("the outbox did not drain")
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
