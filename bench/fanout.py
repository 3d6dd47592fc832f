"""P1 (fan-out to 1,000 listeners) and P6 (10,000 listeners over 100 change kinds, each change
matching 1%): deliveries per second, ours against the bare broadcast server, same clients.

Both servers read the same kind of Redis stream, written by `ChangeBucket.publish_many`, and send
150-byte items; the driver keeps a bounded number of items in flight (`bench.drive`).
"""

from __future__ import annotations

import itertools
from typing import Any

from bench import items
from bench.clients import ClientPool
from bench.drive import CpuWatch, Measured, closed_loop
from bench.profiling import Recording
from bench.scenario import Check, Context, Figure, Result, listeners
from bench.servers import SUB_KINDS
from bench.stack import Stack, bare, ours


def throughput_timing(
    ctx: Context, *, batch: tuple[int, int] = (10, 5), inflight: tuple[int, int] = (50, 50)
) -> dict[str, Any]:
    """`closed_loop`'s load and interval: `batch` and `inflight` as (full run, quick run); the
    defaults are P1's (and P9's, which compares with P1)."""
    return {"batch": ctx.size(*batch), "inflight": ctx.size(*inflight),
            "warmup": ctx.size(2.0, 0.5), "duration": ctx.size(10.0, 1.5)}


async def deliver(
    ctx: Context, stack: Stack, registrations: list[bytes], subs: tuple[str, ...], fanout: int,
    timing: dict[str, Any], *, profile: str | None = None,
) -> tuple[Measured, dict[str, Any] | None]:
    """Closed-loop deliveries/s of `stack` to `registrations`; items cycle over `subs`."""
    with ClientPool(ctx.specs(stack.port, registrations)) as pool:
        pool.ready()
        bucket = stack.bucket()
        numbers = itertools.count()

        async def push(count: int) -> None:
            batch_of = []
            for _ in range(count):
                number = next(numbers)
                batch_of.append(("vm", items.counter_id(number), (subs[number % len(subs)],)))
            await bucket.publish_many(batch_of)

        recording = None
        if profile and ctx.profile:
            recording = Recording(stack.server.pid, timing["warmup"] + timing["duration"],
                                  ctx.work / "profiles" / f"{profile}.txt")
        watch = CpuWatch(stack.pids())
        measured = await closed_loop(push, pool, fanout, watch, **timing)
        await bucket.aclose()
    return measured, recording.summary() if recording else None


def server_us_per_delivery(measured: Measured, side: str = "server") -> float:
    """CPU microseconds the process `side` spent per delivery: comparable when the clients, not
    the server, are the bottleneck."""
    rate = measured.deliveries_per_second
    return round(measured.cpu.get(side, 0.0) / rate * 1e6, 3) if rate else 0.0


def _describe(measured: Measured, loop: str) -> dict[str, Any]:
    return {
        "loop": loop,
        "deliveries_per_second": round(measured.deliveries_per_second),
        "server_cpu_us_per_delivery": server_us_per_delivery(measured),
        "items_per_second": round(measured.items / measured.seconds) if measured.seconds else 0,
        "seconds": round(measured.seconds, 2),
        "undelivered_after_run": measured.undelivered,
        "close_codes": measured.report.close_codes,
        "connections": measured.report.connections,
    }


async def measure_fanout(
    ctx: Context, result: Result, name: str, count: int, subs: tuple[str, ...], fanout: int,
    timing: dict[str, Any],
) -> tuple[Measured, Measured]:
    registrations = listeners(count, subs)
    async with ours(ctx, f"{name}-ours") as stack:
        mine, profile = await deliver(ctx, stack, registrations, subs, fanout, timing,
                                      profile=f"{name}-publisher")
        mine_loop = stack.loop
    with bare(ctx, f"{name}-bare", "stream") as stack:
        base, _ = await deliver(ctx, stack, registrations, subs, fanout, timing)
        base_loop = stack.loop
    result.cpu = {"publisher": mine.cpu, "bare broadcast": base.cpu}
    result.details = {"listeners": count, **timing, "publisher": _describe(mine, mine_loop),
                      "bare broadcast": _describe(base, base_loop)}
    if profile:
        result.details["profile"] = profile
    return mine, base


async def fanout_throughput(ctx: Context) -> Result:
    count = ctx.size(1000, 20)
    result = Result("P1", f"Fan-out: deliveries/s to {count:,} listeners, 150-byte items")
    mine, base = await measure_fanout(ctx, result, "p1", count, ("nic",), count,
                                      throughput_timing(ctx))
    result.checks.append(Check(
        "deliveries/s",
        Figure(f"publisher, {count:,} listeners", round(mine.deliveries_per_second),
               "deliveries/s"),
        Figure("bare websockets broadcast, same frames and clients",
               round(base.deliveries_per_second), "deliveries/s"),
        ">= 0.8x", mine.deliveries_per_second >= 0.8 * base.deliveries_per_second,
    ))
    return result


async def fanout_by_kind(ctx: Context) -> Result:
    count = ctx.size(10_000, 200)
    fanout = count // len(SUB_KINDS)
    result = Result("P6", f"{count:,} listeners over {len(SUB_KINDS)} change kinds, "
                          "each change matching 1%")
    timing = throughput_timing(ctx, batch=(100, 50), inflight=(1000, 200))
    mine, base = await measure_fanout(ctx, result, "p6", count, SUB_KINDS, fanout, timing)
    result.checks.append(Check(
        "deliveries/s",
        Figure(f"publisher, {count:,} listeners, {fanout} per change",
               round(mine.deliveries_per_second), "deliveries/s"),
        Figure("bare broadcast to exactly the matched set", round(base.deliveries_per_second),
               "deliveries/s"),
        ">= 0.9x", mine.deliveries_per_second >= 0.9 * base.deliveries_per_second,
    ))
    return result
