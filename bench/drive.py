"""Load drivers run by the main process: closed-loop throughput and paced latency.

Throughput is measured with a bounded number of items in flight (published but not yet received
by every matching listener), so neither the publisher nor a baseline is ever pushed into its
slow-consumer path: what is measured is the rate at which it delivers, not how it sheds load.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bench import items
from bench.clients import ClientPool, PoolReport
from bench.scenario import ScenarioError
from bench.servers import cpu_seconds, wait_seconds

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
    late_ms: dict[str, float] = field(default_factory=dict)
    """Paced runs: how late the driver got round to each send after its due time (p50, p99,
    max): a driver that falls behind its schedule (a starved core) shows up here, not only as
    the server's latency."""

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
        self.waited = {name: wait_seconds(pid) for name, pid in self.pids.items()}
        self.driver = time.process_time()

    def shares(self) -> dict[str, float]:
        """Cores used by each side; and, as "<side> waiting", the cores' worth of time its
        threads were runnable but not running (starved by the machine's other processes)."""
        wall = time.monotonic() - self.started
        out = {
            name: round((cpu_seconds(pid) - self.before[name]) / wall, 3)
            for name, pid in self.pids.items()
        }
        out["driver"] = round((time.process_time() - self.driver) / wall, 3)
        for name, pid in self.pids.items():
            out[f"{name} waiting"] = round((wait_seconds(pid) - self.waited[name]) / wall, 3)
        return out


def _clients(cpu: dict[str, float], report: PoolReport) -> dict[str, float]:
    """`cpu` plus the client processes' share, over their own measured interval."""
    wall = report.wall_seconds
    return {**cpu, "clients": round(report.cpu_seconds / wall, 3) if wall else 0.0}


def _require_samples(report: PoolReport, side: str) -> None:
    if report.histogram.count == 0:
        raise ScenarioError(f"{side}: no item reached a latency probe in the measured interval")


async def closed_loop(
    push: Push, pool: ClientPool, fanout: int, watch: CpuWatch, *, batch: int, inflight: int,
    warmup: float, duration: float,
) -> Measured:
    """Publish batches while fewer than `inflight` items are undelivered; count deliveries.

    A side that delivers nothing, or leaves items undelivered 10 s after the run, raises
    ScenarioError: its rate would not be a delivery rate."""
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
    cpu = _clients(watch.shares(), report)
    deliveries = received - mark[1]
    expected = published * fanout
    for _ in range(1000):  # up to 10 s for the items in flight
        if pool.received() >= expected:
            break
        await asyncio.sleep(0.01)
    undelivered = expected - pool.received()
    if deliveries <= 0:
        raise ScenarioError(f"nothing delivered in {seconds:.1f} s ({published} items published)")
    if undelivered > 0:
        raise ScenarioError(f"{undelivered} of {expected} deliveries missing 10 s after the run")
    return Measured(seconds, deliveries, published - mark[2], cpu, report, undelivered)


async def pace(
    send: Callable[[int], Awaitable[None]], *, rate: float, warmup: float, duration: float,
    on_mark: Callable[[], None], on_tick: Callable[[float], None] | None = None,
    late: list[int] | None = None,
) -> tuple[float, int]:
    """`send(due)` at each of `due_times` for `warmup + duration` seconds of schedule, calling
    `on_mark()` when the warm-up is over; (seconds since the mark, sends since the mark).
    `late` gets the nanoseconds each send after the mark started past its due time."""
    started = time.monotonic_ns()
    warm, end = started + int(warmup * 1e9), started + int((warmup + duration) * 1e9)
    marked: int | None = None
    sent = 0
    for due in items.due_times(started, rate):
        if due >= end:
            break
        now = time.monotonic_ns()
        if due > now:
            await asyncio.sleep((due - now) / 1e9)
        if marked is None and due >= warm:
            on_mark()
            marked = time.monotonic_ns()
        if marked is not None:
            if on_tick is not None:
                on_tick((due - warm) / 1e9)
            sent += 1
            if late is not None:
                late.append(time.monotonic_ns() - due)
        await send(due)
    assert marked is not None, "a warm-up longer than the run"
    return (time.monotonic_ns() - marked) / 1e9, sent


def _marker(pool: ClientPool, watch: CpuWatch) -> Callable[[], None]:
    def mark() -> None:
        pool.mark()
        watch.start()

    return mark


async def paced(
    send: Send, pool: ClientPool, watch: CpuWatch, *, rate: float, warmup: float,
    duration: float, origin_ns: int, on_tick: Callable[[float], None] | None = None,
) -> Measured:
    """Publish `rate` items a second, each stamped with its due time; histograms from the
    clients. No sample at all raises ScenarioError."""

    async def stamped(due: int) -> None:
        await send(items.stamp(due, origin_ns))

    late: list[int] = []
    seconds, sent = await pace(stamped, rate=rate, warmup=warmup, duration=duration,
                               on_mark=_marker(pool, watch), on_tick=on_tick, late=late)
    cpu = watch.shares()  # before the drain: the sides' shares of the measured interval
    await asyncio.sleep(0.5)  # the last items in flight
    report = pool.report()
    _require_samples(report, "paced run")
    late.sort()
    lateness = {"p50_ms": late[len(late) // 2] / 1e6, "p99_ms": late[len(late) * 99 // 100] / 1e6,
                "max_ms": late[-1] / 1e6} if late else {}
    return Measured(seconds, report.frames, sent, _clients(cpu, report), report,
                    late_ms={k: round(v, 2) for k, v in lateness.items()})
