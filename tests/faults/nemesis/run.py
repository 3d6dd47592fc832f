"""One nemesis run: the system, the writers, every kind of listener, the schedule, the verdict.

    result = await nemesis(seed=7, duration=60, directory=tmp)
    assert not result.judgement.problems(), result.judgement.trace
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from listener import Listener, ListenerConfig
from publisher import ChangeBucket, connect, load_config
from tests.faults.harness import FAST, RESOURCE, Recorder
from tests.faults.nemesis.readers import DurableReader, FeedReader, PullReader, SseReader
from tests.faults.nemesis.schedule import Fault, make_schedule, render
from tests.faults.nemesis.system import Injected, System
from tests.faults.nemesis.verdict import READY_WITHIN, Judgement, judge, recoveries
from tests.faults.nemesis.writers import ApiWriter, BatchWriter, CliWriter, Writer
from tests.faults.oracle import Attempt, History
from tests.servers import scaled

SETTLE = 30.0
"""Seconds every listener has, after the last commit, to deliver it."""


class Follower(Protocol):
    """What the run asks of every listener: `harness.Recorder` and `readers.Reader`."""

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
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        j = self.judgement
        t = j.verdict.total
        return (f"seed {self.seed}: {len(self.done)} faults, committed={j.verdict.committed} "
                f"unknown={j.verdict.unknown} failed={j.verdict.failed} "
                f"received={t.received} covered={t.covered} lost={t.lost} "
                f"announced={t.lost_announced} duplicated={t.duplicated} "
                f"reordered={t.reordered} unacknowledged={t.unacknowledged} "
                f"maybe={t.maybe_received} resyncs={t.resyncs} "
                f"problems={j.problems()[:8]}")


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
    """Inject and heal every fault at its time (faults on other targets overlap)."""

    async def one(fault: Fault) -> None:
        await asyncio.sleep(max(0.0, start + fault.at - time.monotonic()))
        print(f"  {time.monotonic() - start:7.2f}s inject {fault.describe()}", flush=True)
        injected = await system.inject(fault)
        done.append(injected)
        await asyncio.sleep(max(0.0, injected.started + fault.hold - time.monotonic()))
        await system.heal(injected)
        print(f"  {time.monotonic() - start:7.2f}s healed #{fault.number}"
              f"{' ' + '; '.join(injected.notes) if injected.notes else ''}", flush=True)

    await asyncio.gather(*(one(f) for f in faults))


@contextlib.asynccontextmanager
async def writing(writers: Sequence[Writer], stop: Callable[[], bool]) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(w.run(stop)) for w in writers]
    try:
        yield
    finally:
        async with asyncio.timeout(scaled(90)):
            await asyncio.gather(*tasks)


async def nemesis(seed: int, duration: float, directory: Path, *,
                  faults: Sequence[Fault] | None = None,
                  during: Callable[[System, History], Awaitable[None]] | None = None) -> Result:
    """Run the schedule of `seed` (or `faults`) for `duration` seconds; `during` runs beside it
    (the soak's churn and sampling)."""
    schedule = list(faults) if faults is not None else make_schedule(seed, duration)
    print(render(seed, duration, schedule), flush=True)
    began = time.monotonic()
    system = System(directory, soak=during is not None)
    history = History()
    followers: dict[str, Follower] = {}
    try:
        await system.start()
        followers = listeners(system, history)
        for follower in followers.values():
            follower.start()  # type: ignore[attr-defined]
        await asyncio.gather(*(_started(f) for f in followers.values()))
        config = load_config(system.publishers[0].config)
        bucket = ChangeBucket(connect(system.sentinel_url), config.bucket.name, config.resources)
        writers: list[Writer] = [
            ApiWriter(bucket, "api", history, pace=0.1, seed=seed),
            BatchWriter(bucket, "batch", history, pace=0.5, seed=seed),
            CliWriter(system.publishers[0].config, "cli", history, pace=3.0, seed=seed),
        ]
        done: list[Injected] = []
        start = time.monotonic()
        stop = False
        try:
            async with writing(writers, lambda: stop):
                tasks = [run_schedule(system, schedule, start, done)]
                if during is not None:
                    tasks.append(during(system, history))
                await asyncio.gather(*tasks)
                ready = await system.ready(READY_WITHIN)
                await asyncio.sleep(max(0.0, start + duration - time.monotonic()))
                stop = True
            # The last commits: the first may find a loss (the writer's witness) and start a
            # new epoch; every listener must deliver the second.
            await writers[0].once()
            await asyncio.sleep(1.0)
            await writers[0].once()
            last = history.acked[-1] if history.acked else None
            results = await asyncio.gather(*(f.caught_up(last, SETTLE)
                                             for f in followers.values()))
            behind = [n for n, ok in zip(followers, results, strict=True) if not ok]
            await system.evidence()
        finally:
            await bucket.aclose()
        failures = [f"{n}: listener raised {f.failure!r}" for n, f in followers.items()
                    if isinstance(f, Recorder) and f.failure is not None]
        end = time.monotonic()
        judgement = judge(seed, history, done, end, ready=ready, behind=behind,
                          failures=failures)
        return Result(seed, duration, schedule, done, writers, judgement,
                      recoveries(history, done), end - began, system.switches)
    finally:
        for follower in followers.values():
            await follower.aclose()
        await system.aclose()


__all__ = ["Result", "listeners", "nemesis", "run_schedule"]
