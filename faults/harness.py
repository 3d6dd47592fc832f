"""The moving parts every fault scenario shares: servers, a recording writer, recording
listeners, and the result row.

- `Rig` starts and always stops the real servers of one scenario (redis-servers, publisher
  processes, proxies) and the clients around them.
- `Writer` commits changes of a pool of VMs, each state carrying a sequence number, and records
  every outcome in the `History` (faults/oracle.py).
- `Recorder` runs a `listener.Listener` and records every event it delivers.
- `Row` is one line of docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from changefeed_testing.proxy import Proxy
from changefeed_testing.servers import (
    PublisherProcess,
    RedisServer,
    free_port,
    scaled,
    write_config,
)
from faults.oracle import History, Verdict
from faults.records import Attempt, ListenerLog
from listener import (
    Backoff,
    BootstrapDone,
    BootstrapRecords,
    BootstrapStart,
    Change,
    ConnectionLost,
    Event,
    Listener,
    ListenerConfig,
    Resync,
)
from publisher import BucketUnavailable, ChangeBucket, connect, load_config
from publisher import Change as Put

RESOURCE = "vm"
SUBS = ["nic"]

FAST = ListenerConfig(backoff=Backoff(initial=0.02, maximum=0.2), ping_interval=0.5,
                      ping_timeout=1.0, open_timeout=3, heartbeat_interval=None)
"""Listeners that notice a dead or silent publisher within about a second."""

PATIENT = ListenerConfig(backoff=Backoff(initial=0.02, maximum=0.2), ping_interval=10,
                         ping_timeout=10, open_timeout=10, heartbeat_interval=None)
"""Listeners that stay connected to a publisher paused for a few seconds."""


@dataclass(frozen=True)
class Size:
    """How big a run is: `commits` acknowledged changes, faults held `fault` seconds."""

    name: str
    commits: int
    fault: float
    herd: int
    trim_commits: int
    pace: float = 0.004


QUICK = Size("quick", commits=150, fault=1.5, herd=500, trim_commits=1000)
FULL = Size("full", commits=1500, fault=5.0, herd=500, trim_commits=2000)


@dataclass
class Row:
    """One scenario's result: the oracle's verdict and the time to recover."""

    scenario: str
    verdict: Verdict
    recover: float | None
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        t = self.verdict.total
        problems = self.verdict.problems()
        return (f"{self.scenario}: committed={self.verdict.committed} lost={t.lost} "
                f"lost_announced={t.lost_announced} covered={t.covered} "
                f"duplicated={t.duplicated} reordered={t.reordered} "
                f"unacknowledged={t.unacknowledged} maybe={t.maybe_received} "
                f"resyncs={t.resyncs} errors={t.errors} recover={self.recover} "
                f"problems={problems[:6]}{' ...' if len(problems) > 6 else ''} "
                f"notes={self.notes}")


def outcome_unknown(error: BaseException) -> bool:
    """Whether a failed commit may have been written anyway.

    The project is adding a distinct "outcome unknown" exception for commits whose reply was
    lost (a timeout after the request went out); until it exists every `BucketUnavailable`
    means "not written". Recognised by name so the suite needs no change when it lands.
    TODO(issue 11): import the exception by name once it is merged.
    """
    return any("Unknown" in cls.__name__ for cls in type(error).__mro__)


class Writer:
    """Commits `vm` changes of `ids` VMs in turn; state `{"uuid": id, "seq": n}`."""

    def __init__(self, bucket: ChangeBucket, history: History, *, ids: int = 40,
                 pace: float = 0.004) -> None:
        self.bucket = bucket
        self.history = history
        self.ids = ids
        self.pace = pace
        self.seq = 0
        self.acked = 0
        self.failures = 0
        self.last: Attempt | None = None
        self._progress = asyncio.Condition()

    async def commit(self) -> Attempt:
        """One commit, recorded with its outcome."""
        self.seq += 1
        seq, id = self.seq, f"vm-{self.seq % self.ids:03}"
        try:
            cursor = await self.bucket.commit(RESOURCE, id, SUBS, {"uuid": id, "seq": seq})
        except BucketUnavailable as error:
            self.failures += 1
            if outcome_unknown(error):
                return self.history.unknown(id, seq, time.monotonic())
            return self.history.failed(id, seq, time.monotonic())
        attempt = self.history.acknowledged(id, seq, cursor, time.monotonic())
        self.acked += 1
        self.last = attempt
        async with self._progress:
            self._progress.notify_all()
        return attempt

    async def commit_many(self, n: int) -> list[Attempt]:
        """`n` commits in one batch (one script call each 500): for filling a log fast."""
        first = self.seq + 1
        self.seq += n
        changes = [(s, f"vm-{s % self.ids:03}") for s in range(first, first + n)]
        cursors = await self.bucket.commit_many(
            [Put.put(RESOURCE, id, SUBS, {"uuid": id, "seq": s}) for s, id in changes])
        now = time.monotonic()
        attempts = [self.history.acknowledged(id, s, c, now)
                    for (s, id), c in zip(changes, cursors, strict=True)]
        self.acked += n
        self.last = attempts[-1]
        async with self._progress:
            self._progress.notify_all()
        return attempts

    async def run(self, done: Callable[[], bool]) -> None:
        """Commit one change every `pace` seconds until `done()`; after a failure, wait a
        little longer (a writer would back off)."""
        while not done():
            attempt = await self.commit()
            await asyncio.sleep(self.pace if attempt.cursor else 0.05)

    async def wait_acked(self, n: int, within: float = 30) -> None:
        async with asyncio.timeout(scaled(within)), self._progress:
            await self._progress.wait_for(lambda: self.acked >= n)


class Recorder:
    """A `Listener` run in a task; every event it delivers is recorded in its `ListenerLog`."""

    def __init__(self, log: ListenerLog, listener: Listener) -> None:
        self.log = log
        self.listener = listener
        self.close_codes: list[int | None] = []
        self._updated = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self.failure: BaseException | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            await self.listener.run(on_bootstrap=self._event, on_change=self._event,
                                    on_error=self._error)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a fatal listener error: recorded, the scenario fails
            self.failure = error
            self.log.error(f"listener raised {error!r}")
            async with self._updated:
                self._updated.notify_all()

    def _error(self, error: BaseException) -> None:
        if isinstance(error, ConnectionLost):
            self.close_codes.append(error.close_code)

    async def _event(self, event: Event) -> None:
        now = time.monotonic()
        match event:
            case Resync(reason):
                self.log.resync(reason, now)
            case BootstrapStart():
                self.log.bootstrap_start()
            case BootstrapRecords(objects=objects):
                self.log.bootstrap_records((o["uuid"], int(o["seq"])) for o in objects)
            case BootstrapDone():
                self.log.bootstrap_done(now)
            case Change(item):
                self.log.change(item.cursor, item.changed_resource_id, now,
                                coalesced=item.coalesced)
        async with self._updated:
            self._updated.notify_all()

    async def wait(self, predicate: Callable[[], bool], within: float) -> bool:
        """Wait until `predicate()` holds (checked after every event); False on timeout."""
        try:
            async with asyncio.timeout(scaled(within)), self._updated:
                await self._updated.wait_for(lambda: predicate() or self.failure is not None)
        except TimeoutError:
            return False
        return predicate()

    async def bootstrapped(self, within: float = 20) -> None:
        if not await self.wait(lambda: bool(self.log.bootstraps), within):
            raise AssertionError(f"{self.log.name} did not bootstrap: {self.failure!r}")

    async def caught_up(self, attempt: Attempt | None, within: float) -> bool:
        """Wait until this listener has `attempt` (received, or covered by a bootstrap)."""
        if attempt is None:
            return True
        return await self.wait(lambda: self.log.has(attempt), within)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.listener.aclose()


class Rig:
    """The servers and clients of one scenario; `async with Rig(directory) as rig:` stops
    everything it started, in reverse order, whatever happens."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.history = History()
        self.stack = contextlib.AsyncExitStack()
        self.recorders: list[Recorder] = []
        self._count = 0

    async def __aenter__(self) -> Rig:
        await self.stack.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stack.__aexit__(*exc)

    def _dir(self, what: str) -> Path:
        self._count += 1
        return self.directory / f"{what}{self._count}"

    async def redis(self, *, persist: bool = True) -> RedisServer:
        """A private redis-server on a fixed free TCP port (so it can restart on the same URL);
        `persist`: an append-only file fsynced at every write, else nothing on disk."""
        server = RedisServer(self._dir("redis"), tcp=True, persist=persist)
        await asyncio.to_thread(server.start)
        self.stack.callback(server.stop)
        return server

    def config(self, redis: RedisServer, *, port: int | None = None, **extra: Any) -> Path:
        """A config.js for a publisher on `redis` (on a fixed free port, to restart it there)."""
        server = {"host": "127.0.0.1", "port": free_port() if port is None else port}
        return write_config(self._dir("config").with_suffix(".js"), redis.url, server=server,
                            **extra)

    async def publisher(self, config: Path) -> PublisherProcess:
        process = PublisherProcess(config)
        await asyncio.to_thread(process.start)
        self.stack.callback(process.stop)
        return process

    async def bucket(self, config: Path, redis_url: str | None = None) -> ChangeBucket:
        """A writer's bucket, on the config's Redis or on `redis_url` (a proxy in front of it)."""
        loaded = load_config(config)
        url = redis_url or loaded.bucket.redis_url
        assert url is not None
        bucket = ChangeBucket(connect(url), loaded.bucket.name, loaded.resources)
        self.stack.push_async_callback(bucket.aclose)
        return bucket

    async def writer(self, config: Path, size: Size, redis_url: str | None = None) -> Writer:
        return Writer(await self.bucket(config, redis_url), self.history, pace=size.pace)

    async def proxy(self, url: str) -> Proxy:
        """A proxy in front of `url` (http://host:port or redis://host:port/db)."""
        host, _, port = url.partition("://")[2].partition("/")[0].partition(":")
        return await self.stack.enter_async_context(Proxy(host, int(port)))

    async def listener(self, name: str, urls: str | Sequence[str],
                       config: ListenerConfig = FAST) -> Recorder:
        """A started Listener for every `vm` change, bootstrapping first."""
        listener = Listener(urls, instance=f"{name}-instance", service="faults",
                            resources={RESOURCE: ["*"]}, config=config)
        recorder = Recorder(self.history.listener(name), listener)
        recorder.start()
        self.stack.push_async_callback(recorder.aclose)
        self.recorders.append(recorder)
        return recorder

    async def settle(self, within: float = 20) -> list[str]:
        """Wait until every listener has the last acknowledged commit; names the ones that
        did not get there in time."""
        last = self.history.acked[-1] if self.history.acked else None
        results = await asyncio.gather(*(r.caught_up(last, within) for r in self.recorders))
        return [r.log.name for r, ok in zip(self.recorders, results, strict=True) if not ok]

    def recovery(self, fault_end: float | None) -> float | None:
        """Seconds from the end of the fault until every listener delivered a change (or
        completed a bootstrap) again; None when one never did."""
        if fault_end is None:
            return None
        logs = self.history.listeners.values()
        firsts = [log.first_delivery_after(fault_end) for log in logs]
        if not firsts or any(f is None for f in firsts):
            return None
        return max(f for f in firsts if f is not None) - fault_end

    def row(self, scenario: str, fault_end: float | None, behind: list[str],
            notes: Sequence[str] = ()) -> Row:
        found = list(notes)
        if behind:
            found.append(f"not caught up: {', '.join(behind)}")
        for recorder in self.recorders:
            codes = sorted({c for c in recorder.close_codes if c is not None})
            if codes:
                found.append(f"{recorder.log.name} closes {codes}")
        return Row(scenario, self.history.verdict(), self.recovery(fault_end), found)


@contextlib.asynccontextmanager
async def writing(writer: Writer, done: Callable[[], bool]) -> AsyncIterator[asyncio.Task[None]]:
    """Run `writer` in the background until `done()`; the block waits for it on exit."""
    task = asyncio.create_task(writer.run(done))
    try:
        yield task
    finally:
        if not task.done():
            try:
                async with asyncio.timeout(scaled(60)):
                    await asyncio.shield(task)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        else:
            task.result()


Step = Callable[[], Awaitable[None]]


async def exercise(rig: Rig, writer: Writer, size: Size, name: str, inject: Step, heal: Step,
                   *, after_heal: int = 20, notes: Sequence[str] = ()) -> Row:
    """The common shape of a scenario: once every listener has bootstrapped, commit in the
    background; after a third of the commits `inject` the fault, hold it `size.fault` seconds,
    `heal` it; keep committing until `size.commits` are acknowledged and `after_heal` of them
    after the heal; wait until every listener has the last one; return the verdict."""
    for recorder in rig.recorders:
        await recorder.bootstrapped()
    healed_at: list[int] = []

    def done() -> bool:
        return bool(healed_at) and writer.acked >= max(size.commits, healed_at[0] + after_heal)

    async with writing(writer, done):
        await writer.wait_acked(size.commits // 3)
        await inject()
        await asyncio.sleep(size.fault)  # how long the fault lasts, not a readiness wait
        await heal()
        fault_end = time.monotonic()
        healed_at.append(writer.acked)
    behind = await rig.settle()
    return rig.row(name, fault_end, behind, notes)
