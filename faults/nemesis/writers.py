"""The nemesis' writers: each commits changes of its own pool of ids, every commit under an
idempotency key, retried with that key until it is acknowledged (as a service would across a
failover), and records every outcome in the `History`.

- `ApiWriter`: one change per commit, `ChangeBucket.commit(..., key=...)`;
- `BatchWriter`: 1 to 5 changes per commit, `ChangeBucket.commit_many(..., key=...)`;
- `CliWriter`: `changefeed publish --key ... --replicas 1` in a subprocess, now and then (a
  process start costs a core for a moment). A one-shot process has no witness (it cannot tell a
  later commit that Redis lost this one), so it asks the replica to confirm each commit
  (docs/reliability.md): acknowledged then means on both nodes, and a commit the replica did not
  confirm is recorded as of unknown outcome and retried under its key.
- `OutboxWriter`: a service that keeps its state in PostgreSQL (docs/postgres.md): one
  transaction per change, a row of its own table and `changefeed.put(...)`, acknowledged when the
  COMMIT answers; the relay moves it into the bucket, and the writer learns its cursor afterwards
  from the outbox's record (`outbox.cursor`). Some transactions it rolls back on purpose, on
  ids of their own: none may ever be delivered.

A state is `{"uuid": id, "seq": n}`, `n` growing per writer, so a bootstrap that shows an id at
`seq >= n` reflects commit `n` (faults/oracle.py, *covered*).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from changefeed.errors import BucketUnavailable, OutboxRowDead, OutboxWaitTimeout
from changefeed_testing.servers import scaled
from faults.harness import RESOURCE, SUBS, outcome_unknown
from faults.oracle import History
from faults.records import Attempt
from publisher import Change, ChangeBucket, outbox
from publisher.outbox.database import ERRORS as POSTGRES_ERRORS

RETRY_FOR = 30.0
"""Seconds a writer keeps retrying one commit before it records it failed."""
RETRY_PAUSE = 0.1
STATEMENT_TIMEOUT = 2.0
"""Seconds one transaction of the outbox writer may take (PostgreSQL may be paused): past them
it is abandoned, and if its COMMIT was sent, its outcome is unknown."""
ROLLBACK_SHARE = 0.1
"""The share of the outbox writer's transactions it rolls back on purpose."""


class Writer:
    """The common part: a name, ids `<name>-NN`, a sequence, counters, and progress."""

    def __init__(self, name: str, history: History, *, ids: int = 30, pace: float = 0.1,
                 seed: int = 0) -> None:
        self.name = name
        self.history = history
        self.ids = ids
        self.pace = pace
        self.rng = random.Random(f"{seed}-{name}")
        self.seq = 0
        self.acked = 0
        self.tries = 0
        self.failures = 0
        self.last: Attempt | None = None

    def next(self) -> tuple[str, int]:
        self.seq += 1
        return f"{self.name}-{self.rng.randrange(self.ids):02}", self.seq

    async def once(self) -> None:
        raise NotImplementedError

    async def run(self, done: Callable[[], bool]) -> None:
        while not done():
            await self.once()
            await asyncio.sleep(self.pace)

    async def _try_again(self, id: str, seq: int, deadline: float, *, unknown: bool) -> bool:
        """A try of change (`id`, `seq`) failed: recorded of unknown outcome when it may be in;
        whether to try again after a pause (False: past `deadline`, recorded failed)."""
        self.failures += 1
        if unknown:
            self.history.unknown(id, seq, time.monotonic())
        if time.monotonic() > deadline:
            self.history.failed(id, seq, time.monotonic())
            return False
        await asyncio.sleep(RETRY_PAUSE)
        return True

    def _acked(self, id: str, seq: int, cursor: str, since: int, batch: str | None = None) -> None:
        """`since`: the stamp taken before the commit's first try; `batch`: the atomic commit
        it was part of (History.acknowledged)."""
        self.last = self.history.acknowledged(id, seq, cursor, time.monotonic(), since=since,
                                              batch=batch)
        self.acked += 1


class ApiWriter(Writer):
    def __init__(self, bucket: ChangeBucket, name: str, history: History, *,
                 pace: float = 0.1, seed: int = 0) -> None:
        super().__init__(name, history, pace=pace, seed=seed)
        self.bucket = bucket

    async def once(self) -> None:
        id, seq = self.next()
        key = f"{self.name}-{seq}"
        deadline = time.monotonic() + scaled(RETRY_FOR)
        since = self.history.tick()
        while True:
            self.tries += 1
            try:
                cursor = await self.bucket.commit(RESOURCE, id, SUBS, {"uuid": id, "seq": seq},
                                                  key=key)
            except BucketUnavailable as error:
                if await self._try_again(id, seq, deadline, unknown=outcome_unknown(error)):
                    continue
                return
            self._acked(id, seq, cursor, since)
            return


class BatchWriter(ApiWriter):
    async def once(self) -> None:
        batch = [self.next() for _ in range(self.rng.randint(1, 5))]
        key = f"{self.name}-{batch[0][1]}"
        changes = [Change.put(RESOURCE, id, SUBS, {"uuid": id, "seq": seq}) for id, seq in batch]
        deadline = time.monotonic() + scaled(RETRY_FOR)
        since = self.history.tick()
        while True:
            self.tries += 1
            try:
                cursors = await self.bucket.commit_many(changes, key=key)
            except BucketUnavailable as error:
                self.failures += 1
                if outcome_unknown(error):
                    for id, seq in batch:
                        self.history.unknown(id, seq, time.monotonic())
                if time.monotonic() > deadline:
                    for id, seq in batch:
                        self.history.failed(id, seq, time.monotonic())
                    return
                await asyncio.sleep(RETRY_PAUSE)
                continue
            for (id, seq), cursor in zip(batch, cursors, strict=True):
                self._acked(id, seq, cursor, since, key if len(batch) > 1 else None)
            return


class CliWriter(Writer):
    """`changefeed publish --config <config> vm <id> --sub nic --data <state> --key <key>`."""

    def __init__(self, config: Path, name: str, history: History, *,
                 pace: float = 3.0, seed: int = 0) -> None:
        super().__init__(name, history, pace=pace, seed=seed)
        self.config = config

    async def once(self) -> None:
        id, seq = self.next()
        key = f"{self.name}-{seq}"
        state = orjson.dumps({"uuid": id, "seq": seq}).decode()
        command = [sys.executable, "-m", "changefeed_cli", "publish", "--config",
                   str(self.config), RESOURCE, id, "--sub", ",".join(SUBS), "--data", state,
                   "--key", key, "--replicas", "1", "--replicas-timeout", "2"]
        deadline = time.monotonic() + scaled(RETRY_FOR)
        since = self.history.tick()
        while True:
            self.tries += 1
            code, out, err = await _run(command, scaled(30))
            if code == 0:
                self._acked(id, seq, out.strip().splitlines()[-1], since)
                return
            # CommitOutcomeUnknown (a sent commit unanswered: "... may have been written"),
            # written on the master only (the replica did not confirm it: a failover may lose
            # it), or a publish that had to be killed: it may be in.
            maybe = code is None or "may have been written" in err or "written on the master" in err
            if not await self._try_again(id, seq, deadline, unknown=maybe):
                return


@dataclass(slots=True)
class Committed:
    """A transaction the outbox writer committed: its change (`id`, `seq`), its outbox row, the
    stamp and time of its COMMIT, and when its cursor was learnt (None: not yet)."""

    id: str
    seq: int
    row: int
    stamp: int
    time: float
    learnt: float | None = None


class OutboxWriter(Writer):
    """Commits `{"uuid": id, "seq": n}` in PostgreSQL: a row of `nemesis_writes` (its key is
    (writer, seq)) and `outbox.put` in one transaction. Acknowledged at COMMIT (the stamp of the
    attempt is taken then); its cursor is learnt from the outbox's record at the next commits or
    at `resolve`. A COMMIT without an answer is of unknown outcome; the retry first looks for
    its row in `nemesis_writes` (committed after all: acknowledged), and the table's key keeps
    a seq from committing twice."""

    def __init__(self, url: str, name: str, history: History, *, pace: float = 0.2,
                 seed: int = 0) -> None:
        super().__init__(name, history, pace=pace, seed=seed)
        self.url = url
        self.conn: Any = None
        self.commits: list[Committed] = []
        self.pending: list[Committed] = []
        """Committed, cursor not learnt yet."""
        self.rolled_back: set[str] = set()
        """The ids of the transactions rolled back on purpose (never committed)."""
        self.dead: list[str] = []
        self._committing = False

    async def once(self) -> None:
        if self.rng.random() < ROLLBACK_SHARE:
            await self._roll_back()
        id, seq = self.next()
        deadline = time.monotonic() + scaled(RETRY_FOR)
        retry = False
        while True:
            self.tries += 1
            self._committing = False
            try:
                async with asyncio.timeout(scaled(STATEMENT_TIMEOUT)):
                    row = await self._commit(id, seq, retry)
            except POSTGRES_ERRORS:
                self.failures += 1
                self._drop()
                if self._committing:
                    self.history.unknown(id, seq, time.monotonic())
                if time.monotonic() > deadline:
                    self.history.failed(id, seq, time.monotonic())
                    return
                retry = True
                await asyncio.sleep(RETRY_PAUSE)
                continue
            break
        committed = Committed(id, seq, row, self.history.tick(), time.monotonic())
        self.commits.append(committed)
        self.pending.append(committed)
        await self.learn()

    async def _connection(self) -> Any:
        if self.conn is None or self.conn.is_closed():
            self.conn = await asyncpg.connect(self.url)
        return self.conn

    def _drop(self) -> None:
        if self.conn is not None:
            self.conn.terminate()  # an open transaction is rolled back by the server
        self.conn = None

    async def _commit(self, id: str, seq: int, retry: bool) -> int:
        conn = await self._connection()
        if retry:  # did a COMMIT without an answer commit?
            row = await conn.fetchval(
                "SELECT row_id FROM nemesis_writes WHERE writer = $1 AND seq = $2", self.name, seq)
            if row is not None:
                return int(row)
        transaction = conn.transaction()
        await transaction.start()
        row = await outbox.put(conn, RESOURCE, id, SUBS, {"uuid": id, "seq": seq})
        await conn.execute("INSERT INTO nemesis_writes VALUES ($1, $2, $3, $4)",
                           self.name, seq, id, row)
        self._committing = True
        await transaction.commit()
        return row

    async def _roll_back(self) -> None:
        """A transaction of an id of its own, rolled back: nothing of it may be delivered."""
        self.seq += 1
        id = f"{self.name}-rolledback-{self.rng.randrange(self.ids):02}"
        self.rolled_back.add(id)
        try:
            async with asyncio.timeout(scaled(STATEMENT_TIMEOUT)):
                conn = await self._connection()
                transaction = conn.transaction()
                await transaction.start()
                await outbox.put(conn, RESOURCE, id, SUBS, {"uuid": id, "seq": self.seq})
                await transaction.rollback()
        except POSTGRES_ERRORS:
            self._drop()

    async def learn(self) -> None:
        """Record every pending commit the relay has relayed (its cursor, from the outbox's
        record) as acknowledged, at its COMMIT's stamp; a dead row is a committed change that
        will never be delivered: recorded as acknowledged under a cursor no listener can
        receive, and named."""
        try:
            async with asyncio.timeout(scaled(STATEMENT_TIMEOUT)):
                conn = await self._connection()
                for c in list(self.pending):
                    try:
                        cursor = await outbox.cursor(conn, c.row, timeout=0)
                    except OutboxWaitTimeout:
                        continue
                    except OutboxRowDead as error:
                        self.dead.append(f"{c.id} seq {c.seq} (row {c.row}): {error}")
                        cursor = f"dead-row-{c.row}"
                    self.pending.remove(c)
                    c.learnt = time.monotonic()
                    self.last = self.history.acknowledged(c.id, c.seq, cursor, c.time,
                                                          stamp=c.stamp)
                    self.acked += 1
        except POSTGRES_ERRORS:
            self._drop()

    async def resolve(self, within: float) -> list[Committed]:
        """Learn every pending cursor within `within` seconds (the relay drains the outbox);
        those never relayed are recorded as acknowledged under a cursor no listener can
        receive (lost), and returned."""
        deadline = time.monotonic() + scaled(within)
        while self.pending and time.monotonic() < deadline:
            await self.learn()
            if self.pending:
                await asyncio.sleep(0.1)  # the relay's progress has no event here
        never = list(self.pending)
        for c in never:
            self.history.acknowledged(c.id, c.seq, f"never-relayed-{c.row}", c.time,
                                      stamp=c.stamp)
        self.pending.clear()
        return never

    async def aclose(self) -> None:
        if self.conn is not None and not self.conn.is_closed():
            await self.conn.close()


async def _run(command: list[str], timeout: float) -> tuple[int | None, str, str]:
    """Run `command`; its exit code (None when it had to be killed), stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(timeout):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        out, err = await process.communicate()
        return None, out.decode(errors="replace"), err.decode(errors="replace")
    return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")


__all__ = ["ApiWriter", "BatchWriter", "CliWriter", "Committed", "OutboxWriter", "Writer"]
