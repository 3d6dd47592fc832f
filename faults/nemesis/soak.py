"""The soak: the nemesis' system under churn, with resources sampled and their slopes judged.

Beside the run's own listeners and writers, `churn` keeps listeners coming and going: a new one
every `CHURN_EVERY` seconds, living 1 to 8 s, a third of them resuming from the cursor a previous
one stopped at, 1% of them slow (through a proxy that lets 1000 B/s through), some of them
refused (publisher 1 takes at most 12 listeners: `clientLimits.maxListeners`). `sample` reads
every `EVERY` seconds each publisher's `/metrics` (`process_resident_memory_bytes`,
`process_open_fds`, `changefeed_asyncio_tasks`) and the Redis master's `used_memory`.

A leak is a slope that does not flatten: the least-squares slope over the second half of the run
(per minute) must stay under `LIMITS` (an absolute floor, or a share of the level, whichever is
larger). A publisher restarted by a fault starts a new series: the slope is taken over the
longest series of one process in the second half.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
import redis

from changefeed_testing.proxy import SlowSocket
from faults.harness import FAST, RESOURCE
from faults.nemesis.system import System
from listener import Listener, ListenerError

EVERY = 3.0
"""Seconds between samples."""
CHURN_EVERY = 0.5
SLOW_RATE = 1000

METRICS = {
    "rss": "process_resident_memory_bytes",
    "fds": "process_open_fds",
    "tasks": "changefeed_asyncio_tasks",
}


@dataclass(frozen=True, slots=True)
class Limit:
    """A slope (per minute) above both `floor` and `share` x the mean level is a leak."""

    floor: float
    share: float


LIMITS = {
    "rss": Limit(floor=2**20, share=0.015),
    "fds": Limit(floor=6, share=0.10),
    "tasks": Limit(floor=12, share=0.10),
    "redis": Limit(floor=2 * 2**20, share=0.05),
}
"""What a leak is, per minute: a publisher gaining 1 MiB (or 1.5%) of RSS, 6 file descriptors or
12 tasks (or 10%), Redis 2 MiB (or 5%), steadily over the second half. A leak of one fd or task
per registration at the churn's rate (2 a second) is 120 a minute; 500 bytes per commit at the
writers' rate (16 a second) is 0.5 MiB a minute: what the delivery trace filling (10,000 items)
looked like, until the soak's config bounded it to 500 (`System._config`)."""


@dataclass
class Samples:
    """Series by (component, metric): (time, process id, value)."""

    series: dict[tuple[str, str], list[tuple[float, int, float]]] = field(
        default_factory=lambda: defaultdict(list))
    churned: int = 0
    slow: int = 0
    refused: int = 0
    resumed: int = 0

    def add(self, component: str, metric: str, t: float, pid: int, value: float) -> None:
        self.series[component, metric].append((t, pid, value))


def slope(points: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of (t, value) points, per second (0 for fewer than 3)."""
    if len(points) < 3:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mt) * (v - mv) for t, v in points) / var


@dataclass(frozen=True, slots=True)
class Slope:
    component: str
    metric: str
    per_minute: float
    mean: float
    points: int

    @property
    def leak(self) -> bool:
        limit = LIMITS[self.metric]
        return self.per_minute > max(limit.floor, limit.share * self.mean)

    def describe(self) -> str:
        unit = 2**20 if self.metric in ("rss", "redis") else 1
        suffix = " MiB" if unit != 1 else ""
        return (f"{self.component} {self.metric}: {self.per_minute / unit:+.2f}{suffix}/min "
                f"(mean {self.mean / unit:.1f}{suffix}, {self.points} samples)"
                f"{' LEAK' if self.leak else ''}")


def slopes(samples: Samples, start: float, end: float) -> list[Slope]:
    """Each series' slope over the second half of [start, end], on its longest run of one
    process there; a series none of whose processes lived through most of that half (a
    publisher or Redis restarted by a fault: its start is warm-up, not a leak) is left out."""
    half = start + (end - start) / 2
    found = []
    for (component, metric), series in sorted(samples.series.items()):
        by_pid: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for t, pid, value in series:
            if half <= t <= end:
                by_pid[pid].append((t, value))
        if not by_pid:
            continue
        points = max(by_pid.values(), key=len)
        if points[-1][0] - points[0][0] < 0.7 * (end - half):
            continue
        mean = sum(v for _, v in points) / len(points)
        found.append(Slope(component, metric, slope(points) * 60, mean, len(points)))
    return found


def parse_metrics(text: str) -> dict[str, float]:
    """The unlabelled samples of a Prometheus text exposition."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                values[name] = float(value)
    return values


async def sample(system: System, samples: Samples, until: float) -> None:
    """Every EVERY seconds until `until`: each publisher's metrics, the master's memory."""
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < until:
            now = time.monotonic()
            for n, publisher in enumerate(system.publishers):
                pid = publisher.process.pid if publisher.process else 0
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(publisher.url + "/metrics",
                                           timeout=aiohttp.ClientTimeout(total=2)) as reply:
                        values = parse_metrics(await reply.text())
                    for metric, name in METRICS.items():
                        if name in values:
                            samples.add(f"publisher-{n}", metric, now, pid, values[name])
            with contextlib.suppress(RuntimeError, redis.RedisError, StopIteration):
                master = await asyncio.to_thread(system.master)
                memory = await asyncio.to_thread(_used_memory, master.port)
                pid = master.process.pid if master.process else 0
                samples.add("redis", "redis", now, pid, memory)
            await asyncio.sleep(max(0.0, now + EVERY - time.monotonic()))


def _used_memory(port: int) -> float:
    with redis.Redis(host="127.0.0.1", port=port, socket_timeout=2) as client:
        return float(client.info("memory")["used_memory"])


async def churn(system: System, samples: Samples, until: float, seed: int) -> None:
    """Listeners joining and leaving until `until` (see the module's docstring)."""
    rng = random.Random(f"{seed}-churn")
    cursors: list[str] = []
    tasks: set[asyncio.Task[None]] = set()
    p1 = system.port_of(system.publishers[1])
    async with SlowSocket("127.0.0.1", p1, SLOW_RATE) as slow:
        try:
            while time.monotonic() < until:
                samples.churned += 1
                is_slow = rng.random() < 0.01
                samples.slow += is_slow
                since = rng.choice(cursors) if cursors and rng.random() < 0.33 else None
                samples.resumed += since is not None
                urls = [slow.url] if is_slow else [system.urls[1], system.urls[rng.randrange(3)]]
                life = rng.uniform(1, 8) * (3 if is_slow else 1)
                task = asyncio.create_task(_one(samples.churned, urls, since, life, cursors))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                await asyncio.sleep(CHURN_EVERY)
        finally:
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _one(n: int, urls: list[str], since: str | None, life: float,
               cursors: list[str]) -> None:
    listener = Listener(urls, instance=f"churn-{n}", service="churn",
                        resources={RESOURCE: ["*"]}, since=since, bootstrap=False, config=FAST)
    try:
        async with asyncio.timeout(life):
            async for _ in listener:
                pass
    except (TimeoutError, ListenerError):
        pass
    finally:
        if listener.cursor:
            cursors.append(listener.cursor)
            del cursors[:-200]
        await listener.aclose()


async def refusals(system: System) -> int:
    """Registrations the publishers refused (their `/metrics`)."""
    total = 0
    async with aiohttp.ClientSession() as session:
        for url in system.urls:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url + "/metrics",
                                       timeout=aiohttp.ClientTimeout(total=2)) as reply:
                    for line in (await reply.text()).splitlines():
                        if line.startswith("changefeed_registrations_refused_total{"):
                            total += int(float(line.rpartition(" ")[2]))
    return total


__all__ = ["LIMITS", "Samples", "Slope", "churn", "parse_metrics", "refusals", "sample",
           "slope", "slopes"]
