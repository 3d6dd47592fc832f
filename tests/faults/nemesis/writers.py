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

A state is `{"uuid": id, "seq": n}`, `n` growing per writer, so a bootstrap that shows an id at
`seq >= n` reflects commit `n` (tests/faults/oracle.py, *covered*).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from changefeed.errors import BucketUnavailable
from publisher import Change, ChangeBucket
from tests.faults.harness import RESOURCE, SUBS, outcome_unknown
from tests.faults.oracle import Attempt, History
from tests.servers import scaled

RETRY_FOR = 30.0
"""Seconds a writer keeps retrying one commit before it records it failed."""
RETRY_PAUSE = 0.1


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

    def _acked(self, id: str, seq: int, cursor: str) -> None:
        self.last = self.history.acknowledged(id, seq, cursor, time.monotonic())
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
        while True:
            self.tries += 1
            try:
                cursor = await self.bucket.commit(RESOURCE, id, SUBS, {"uuid": id, "seq": seq},
                                                  key=key)
            except BucketUnavailable as error:
                self.failures += 1
                if outcome_unknown(error):
                    self.history.unknown(id, seq, time.monotonic())
                if time.monotonic() > deadline:
                    self.history.failed(id, seq, time.monotonic())
                    return
                await asyncio.sleep(RETRY_PAUSE)
                continue
            self._acked(id, seq, cursor)
            return


class BatchWriter(ApiWriter):
    async def once(self) -> None:
        batch = [self.next() for _ in range(self.rng.randint(1, 5))]
        key = f"{self.name}-{batch[0][1]}"
        changes = [Change.put(RESOURCE, id, SUBS, {"uuid": id, "seq": seq}) for id, seq in batch]
        deadline = time.monotonic() + scaled(RETRY_FOR)
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
                self._acked(id, seq, cursor)
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
        while True:
            self.tries += 1
            code, out, err = await _run(command, scaled(30))
            if code == 0:
                self._acked(id, seq, out.strip().splitlines()[-1])
                return
            self.failures += 1
            # CommitOutcomeUnknown (a sent commit unanswered: "... may have been written"),
            # written on the master only (the replica did not confirm it: a failover may lose
            # it), or a publish that had to be killed: it may be in.
            if code is None or "may have been written" in err or "written on the master" in err:
                self.history.unknown(id, seq, time.monotonic())
            if time.monotonic() > deadline:
                self.history.failed(id, seq, time.monotonic())
                return
            await asyncio.sleep(RETRY_PAUSE)


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


__all__ = ["ApiWriter", "BatchWriter", "CliWriter", "Writer"]
