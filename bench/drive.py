"""Load drivers run by the main process: closed-loop throughput and paced latency.

Throughput is measured with a bounded number of items in flight (published but not yet received
by every matching listener), so neither the publisher nor a baseline is ever pushed into its
slow-consumer path: what is measured is the rate at which it delivers, not how it sheds load.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bench.clients import ClientPool, PoolReport
from bench.servers import cpu_seconds

Push = Callable[[int], Awaitable[None]]
"""Publish this many items (as one batch)."""
Send = Callable[[str], Awaitable[None]]
"""Publish one item with this id."""


@dataclass
class Measured:
    """What a measured interval gave: the rate and the CPU each side used."""

    seconds: float
    deliveries: int
    items: int
    cpu: dict[str, float]
    """side -> cores used (CPU seconds / wall seconds)."""
    report: PoolReport
    undelivered: int = 0

    @property
    def deliveries_per_second(self) -> float:
        return self.deliveries / self.seconds if self.seconds else 0.0


class CpuWatch:
    """CPU seconds of the named processes (and of this one, the driver) over an interval."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.start()

    def start(self) -> None:
        self.started = time.monotonic()
        self.before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.driver = time.process_time()

    def shares(self, report: PoolReport | None = None) -> dict[str, float]:
        wall = time.monotonic() - self.started
        out = {
            name: round((cpu_seconds(pid) - self.before[name]) / wall, 3)
            for name, pid in self.pids.items()
        }
        out["driver"] = round((time.process_time() - self.driver) / wall, 3)
        if report is not None:
            out["clients"] = round(report.cpu_seconds / wall, 3)
        return out


async def closed_loop(
    push: Push, pool: ClientPool, fanout: int, watch: CpuWatch, *, batch: int, inflight: int,
    warmup: float, duration: float,
) -> Measured:
    """Publish batches while fewer than `inflight` items are undelivered; count deliveries."""
    published = 0
    started = time.monotonic()
    mark: tuple[float, int, int] | None = None
    limit = inflight * fanout
    while True:
        now = time.monotonic()
        received = pool.received()
        if mark is None and now - started >= warmup:
            pool.mark()
            watch.start()
            mark = (now, received, published)
        elif mark is not None and now - mark[0] >= duration:
            break
        if published * fanout - received < limit:
            await push(batch)
            published += batch
        else:
            await asyncio.sleep(0.0002)
    seconds = now - mark[0]
    report = pool.report()
    cpu = watch.shares(report)
    deliveries = received - mark[1]
    expected = published * fanout
    for _ in range(1000):  # up to 10 s for the items in flight
        if pool.received() >= expected:
            break
        await asyncio.sleep(0.01)
    return Measured(
        seconds, deliveries, published - mark[2], cpu, report, expected - pool.received()
    )


async def paced(
    send: Send, pool: ClientPool, watch: CpuWatch, *, rate: float, warmup: float,
    duration: float, stamp: Callable[[], str], on_tick: Callable[[float], None] | None = None,
) -> Measured:
    """Publish `rate` items a second, each stamped when sent; histograms from the clients."""
    started = time.monotonic_ns()
    number = 0
    marked: float | None = None
    sent_at_mark = 0
    while True:
        due = started + int(number * 1e9 / rate)
        now = time.monotonic_ns()
        if due > now:
            await asyncio.sleep((due - now) / 1e9)
        elapsed = (time.monotonic_ns() - started) / 1e9
        if marked is None and elapsed >= warmup:
            pool.mark()
            watch.start()
            marked, sent_at_mark = elapsed, number
        if elapsed >= warmup + duration:
            break
        if on_tick is not None and marked is not None:
            on_tick(elapsed - marked)
        await send(stamp())
        number += 1
    await asyncio.sleep(0.5)  # the last items in flight
    report = pool.report()
    cpu = watch.shares(report)
    assert marked is not None
    return Measured(elapsed - marked, report.frames, number - sent_at_mark, cpu, report)


async def passive(
    pool: ClientPool, watch: CpuWatch, *, warmup: float, duration: float
) -> Measured:
    """For a server that makes its own items (`bench.broadcast --mode timer`): only listen."""
    await asyncio.sleep(warmup)
    pool.mark()
    watch.start()
    await asyncio.sleep(duration)
    report = pool.report()
    return Measured(duration, report.frames, 0, watch.shares(report), report)
