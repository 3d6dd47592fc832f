"""One nemesis run: the system, the writers, every kind of listener, the schedule, the verdict.

    result = await nemesis(seed=7, duration=60, directory=tmp)
    assert not result.judgement.problems(), result.judgement.trace
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from changefeed_testing.servers import scaled
from faults.harness import FAST, RESOURCE, Recorder
from faults.nemesis.evidence import write as write_history
from faults.nemesis.readers import DurableReader, FeedReader, PullReader, SseReader
from faults.nemesis.schedule import Fault, make_schedule, render
from faults.nemesis.soak import Samples, Slope, churn, refusals, sample, slopes
from faults.nemesis.spark_writer import SparkWriter, StreamWriter
from faults.nemesis.spark_writer import session as spark_session
from faults.nemesis.system import Injected, System
from faults.nemesis.verdict import (
    READY_WITHIN,
    Judgement,
    judge,
    outbox_problems,
    recoveries,
    relayed_in_doubt,
)
from faults.nemesis.writers import (
    ApiWriter,
    BatchWriter,
    CliWriter,
    Committed,
    OutboxWriter,
    Writer,
)
from faults.oracle import History
from faults.records import Attempt
from listener import Listener, ListenerConfig
from publisher import ChangeBucket, connect, load_config

SETTLE = 30.0
"""Seconds every listener has, after the last commit, to deliver it."""


class Follower(Protocol):
    """What the run asks of every listener: `harness.Recorder` and `readers.Reader`."""

    def start(self) -> None: ...

    async def caught_up(self, attempt: Attempt | None, within: float) -> bool: ...

    async def aclose(self) -> None: ...


@dataclass
class Result:
    """A run: its schedule, the faults as injected, the writers, the verdict."""

    seed: int
    duration: float
    faults: list[Fault]
    done: list[Injected]
    writers: list[Writer]
    judgement: Judgement
    recover: list[float]
    seconds: float
    switches: int = 0
    slopes: list[Slope] = field(default_factory=list)
    samples: Samples | None = None
    """A soak's churn and resource samples; None for a run that was no soak."""

    @property
    def outbox(self) -> OutboxWriter | None:
        return next((w for w in self.writers if isinstance(w, OutboxWriter)), None)

    def summary(self) -> str:
        j = self.judgement
        t = j.verdict.total
        outbox = self.outbox
        return (f"seed {self.seed}: {len(self.done)} faults, committed={j.verdict.committed} "
                f"(outbox={len(outbox.commits) if outbox else 0} "
                f"rolled back={len(outbox.rolled_back) if outbox else 0}) "
                f"unknown={j.verdict.unknown} failed={j.verdict.failed} "
                f"received={t.received} covered={t.covered} lost={t.lost} "
                f"announced={t.lost_announced} duplicated={t.duplicated} "
                f"reordered={t.reordered} unacknowledged={t.unacknowledged} "
                f"maybe={t.maybe_received} resyncs={t.resyncs} "
                f"problems={j.problems()[:8]} findings={j.verdict.findings()[:8]}")


def listeners(system: System, history: History) -> dict[str, Follower]:
    """Every kind of listener, on URLs that overlap the faults' targets."""
    assert system.link is not None
    p0, p1, p2 = system.urls
    link = system.link.url

    def ws(name: str, urls: list[str], *, coalesce: bool = False,
           config: ListenerConfig = FAST) -> Recorder:
        listener = Listener(urls, instance=f"{name}-instance", service="nemesis",
                            resources={RESOURCE: ["*"]}, config=config, coalesce=coalesce)
        return Recorder(history.listener(name), listener)

    return {
        "ws-0-1": ws("ws-0-1", [p0, p1]),
        "ws-2-0": ws("ws-2-0", [p2, p0]),
        "ws-link": ws("ws-link", [link, p1]),
        "ws-coalesce": ws("ws-coalesce", [link, p2], coalesce=True),
        "sse": SseReader(history.listener("sse"), [link, p1]),
        "pull": PullReader(history.listener("pull"), [p1, p0]),
        "durable": DurableReader(history.listener("durable", at_least_once=True), [p1, p2]),
        "feed": FeedReader(history.listener("feed"), [p2, p0]),
    }


async def _started(follower: Follower) -> None:
    if isinstance(follower, Recorder):
        await follower.bootstrapped(30)
    else:
        async with asyncio.timeout(scaled(30)):
            await follower.started.wait()  # type: ignore[attr-defined]


async def run_schedule(system: System, faults: Sequence[Fault], start: float,
                       done: list[Injected]) -> None:
    """Inject and heal every fault at its time (faults on other targets overlap). A fault
    whose target is still being healed (a publisher starting again takes a moment, longer on a
    busy machine) waits for that heal: faults on one target never overlap. A relay fault's
    target is the publisher holding the relay lock when it begins (`System.aim`), so it waits
    for a publisher fault on that one too."""
    healing: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    async def one(fault: Fault) -> None:
        await asyncio.sleep(max(0.0, start + fault.at - time.monotonic()))
        while True:
            hit = await system.aim(fault)
            waited = healing[hit].locked()
            async with healing[hit]:
                if waited and await system.aim(fault) != hit:
                    continue  # the relay moved while its publisher was healing: aim again
                late = time.monotonic() - start - fault.at
                print(f"  {time.monotonic() - start:7.2f}s inject {fault.describe()}"
                      f"{f' ({late:.2f}s late: its target was healing)' if late > 0.1 else ''}",
                      flush=True)
                injected = await system.inject(fault, hit)
                done.append(injected)
                await asyncio.sleep(max(0.0, injected.started + fault.hold - time.monotonic()))
                await system.heal(injected)
            break
        print(f"  {time.monotonic() - start:7.2f}s healed #{fault.number}"
              f"{' ' + '; '.join(injected.notes) if injected.notes else ''}", flush=True)

    await asyncio.gather(*(one(f) for f in faults))


@contextlib.asynccontextmanager
async def writing(writers: Sequence[Writer]) -> AsyncIterator[asyncio.Event]:
    """Run `writers` until the event this yields is set, or the block ends (then waits for
    them: each finishes the commit it is at, retries included)."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(w.run(stop.is_set)) for w in writers]
    try:
        yield stop
    finally:
        stop.set()
        async with asyncio.timeout(scaled(90)):
            await asyncio.gather(*tasks)


@dataclass
class Run:
    """What a run holds while it goes: the system, the history, the listeners, the writers."""

    seed: int
    system: System
    history: History = field(default_factory=History)
    followers: dict[str, Follower] = field(default_factory=dict)
    writers: list[Writer] = field(default_factory=list)
    done: list[Injected] = field(default_factory=list)
    bucket: ChangeBucket | None = None
    never_relayed: list[Committed] = field(default_factory=list)
    spark: bool = False
    """Spark writers too, a batch job per change and a streaming query
    (faults/nemesis/spark_writer.py): opt-in, they cost a core."""
    session: Any = None

    async def start(self) -> None:
        await self.system.start()
        self.followers = listeners(self.system, self.history)
        for follower in self.followers.values():
            follower.start()
        await asyncio.gather(*(_started(f) for f in self.followers.values()))
        config = load_config(self.system.publishers[0].config)
        self.bucket = ChangeBucket(connect(self.system.sentinel_url), config.bucket.name,
                                   config.resources)
        self.writers = [
            ApiWriter(self.bucket, "api", self.history, pace=0.1, seed=self.seed),
            BatchWriter(self.bucket, "batch", self.history, pace=0.5, seed=self.seed),
            CliWriter(self.system.publishers[0].config, "cli", self.history, pace=3.0,
                      seed=self.seed),
            OutboxWriter(self.system.outbox.url, "outbox", self.history, pace=0.2,
                         seed=self.seed),
        ]
        if self.spark:
            self.session = await asyncio.to_thread(spark_session)
            url = self.system.sentinel_url
            self.writers += [
                SparkWriter(self.session, url, self.bucket, "spark", self.history, pace=2.0,
                            seed=self.seed),
                StreamWriter(self.session, url, self.bucket, "spark-stream", self.history,
                             self.system.directory, pace=2.0, seed=self.seed),
            ]

    @property
    def outbox(self) -> OutboxWriter:
        return next(w for w in self.writers if isinstance(w, OutboxWriter))

    async def settle(self) -> list[str]:
        """The last commits: the first may find a loss (the writer's witness) and start a new
        epoch; every listener must deliver the second. The names of those that did not. Before
        them the outbox writer learns the cursor of every commit of its (the relay drains the
        outbox), so that they are in the bucket before the last commit every listener must
        deliver."""
        self.never_relayed = await self.outbox.resolve(SETTLE)
        await self.writers[0].once()
        await asyncio.sleep(1.0)
        await self.writers[0].once()
        last = self.history.acked[-1] if self.history.acked else None
        results = await asyncio.gather(*(f.caught_up(last, SETTLE)
                                         for f in self.followers.values()))
        return [n for n, ok in zip(self.followers, results, strict=True) if not ok]

    async def aclose(self) -> None:
        if self.bucket is not None:
            await self.bucket.aclose()
        for writer in self.writers:
            if isinstance(writer, OutboxWriter | StreamWriter):
                await writer.aclose()
        for follower in self.followers.values():
            await follower.aclose()
        if self.session is not None:
            await asyncio.to_thread(self.session.stop)
        await self.system.aclose()


async def nemesis(seed: int, duration: float, directory: Path, *,
                  faults: Sequence[Fault] | None = None, soak: bool = False,
                  spark: bool = False) -> Result:
    """Run the schedule of `seed` (or `faults`) for `duration` seconds, then judge the history.
    `soak`: with churn and resource sampling beside it (faults/nemesis/soak.py); `spark`:
    with Spark writers too."""
    schedule = list(faults) if faults is not None else make_schedule(seed, duration)
    print(render(seed, duration, schedule), flush=True)
    began = time.monotonic()
    run = Run(seed, System(directory, soak=soak), spark=spark)
    samples = Samples()
    try:
        await run.start()
        start = time.monotonic()
        async with writing(run.writers) as stop:
            beside = [asyncio.create_task(churn(run.system, samples, start + duration, seed)),
                      asyncio.create_task(sample(run.system, samples, start + duration)),
                      ] if soak else []
            await run_schedule(run.system, schedule, start, run.done)
            ready = await run.system.ready(READY_WITHIN)
            await asyncio.gather(*beside)
            await asyncio.sleep(max(0.0, start + duration - time.monotonic()))
            stop.set()
        end = time.monotonic()
        if soak:
            samples.refused = await refusals(run.system)
        behind = await run.settle()
        await run.system.evidence()
        failures = [f"{n}: listener raised {f.failure!r}" for n, f in run.followers.items()
                    if isinstance(f, Recorder) and f.failure is not None]
        measured = phases(samples, start, end, schedule) if soak else []
        failures += [f"leak: {s.describe()}" for s in measured if s.leak]
        failures += await outbox_end(run)
        judgement = judge(seed, run.history, run.done, time.monotonic(), ready=ready,
                          behind=behind, failures=failures, rolled_back=run.outbox.rolled_back)
        evidence = write_history(directory, run.history, run.done, start)
        if judgement.problems():
            judgement.trace += f"\nthe whole history: {evidence}"
        return Result(seed, duration, schedule, run.done, run.writers, judgement,
                      recoveries(run.history, run.done), time.monotonic() - began,
                      run.system.switches, slopes=measured,
                      samples=samples if soak else None)
    finally:
        await run.aclose()


async def outbox_end(run: Run) -> list[str]:
    """The outbox after the run: its commits whose relay spans a history-destroying fault are
    recorded as of unknown outcome too (verdict.relayed_in_doubt), and what is wrong with it."""
    writer = run.outbox
    spans = [(c.id, c.seq, c.time, c.learnt) for c in writer.commits]
    for id, seq in relayed_in_doubt(spans, run.done, time.monotonic()):
        run.history.unknown(id, seq, time.monotonic())
    status = await run.system.outbox.status()
    return outbox_problems(status, len(run.never_relayed), writer.dead)


def phases(samples: Samples, start: float, end: float, schedule: Sequence[Fault]) -> list[Slope]:
    """The slopes of the soak: over the second half of the part without faults, and over the
    second half of the part with faults (when both are long enough)."""
    first = min((f.at for f in schedule), default=end - start)
    found = []
    if first >= 30:
        found += slopes(samples, start, start + first)
    if end - start - first >= 30:
        found += [replace(s, component=f"{s.component} (faults)")
                  for s in slopes(samples, start + first, end)]
    return found


__all__ = ["Result", "Run", "listeners", "nemesis", "phases", "run_schedule"]
