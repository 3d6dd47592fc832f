"""P1T: what the delivery trace (publisher.trace) costs: P1's fan-out to 1,000 listeners (two
services) with trace recording on (the default `trace` section) against the same publisher with
`trace: {items: 0}`, same clients, same run, in the order off, on, on, off (each side's figure
is the mean of its two runs, so drift over the run weighs on both alike). Also the memory a full
trace holds, measured in this process with tracemalloc.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import orjson

from bench.drive import Measured
from bench.fanout import deliver, server_us_per_delivery, throughput_timing
from bench.scenario import Check, Context, Figure, Result
from bench.stack import ours
from changefeed.cursor import StreamId
from changefeed.protocol import ChangeKind, Registration
from publisher.config import Trace
from publisher.trace import TraceLog

OFF: dict[str, Any] = {"trace": {"items": 0}}
ON: dict[str, Any] = {"trace": {"items": Trace().items}}


def registrations(count: int) -> list[bytes]:
    """`count` listeners of vm nic, half of service "bench", half of "billing"."""
    kind = ChangeKind("vm", ("nic",))
    return [orjson.dumps(Registration(f"bench-{n:06d}", ("bench", "billing")[n % 2], (kind,),
                                      1).to_wire()) for n in range(count)]


class _Entry:
    __slots__ = ("frame", "position", "sse")

    def __init__(self, position: StreamId) -> None:
        self.position = position
        self.frame = b"%d" % position.ms
        self.sse: bytes | None = None


def trace_memory(items: int, services: int) -> tuple[int, int]:
    """Bytes a full trace of `items` changes, each written to `services` services, holds; and
    what it holds after as many again (the bound)."""
    trace = TraceLog(items, None)
    tracemalloc.start()
    try:
        for phase in range(2):
            for n in range(items):
                entry = _Entry(StreamId(1_700_000_000_000 + phase * items + n, 0))
                writes = [(f"service-{s}", [entry.frame]) for s in range(services)]
                trace.published("bencheepoch", [entry], writes, 1.0, 1.0)
            if phase == 0:
                full, _ = tracemalloc.get_traced_memory()
        again, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return full, again


async def p1t(ctx: Context) -> Result:
    count = ctx.size(1000, 20)
    result = Result("P1T", f"Delivery trace cost: P1's fan-out to {count:,} listeners, trace "
                           "recording on against off")
    timing = throughput_timing(ctx)
    regs = registrations(count)
    runs: dict[str, list[Measured]] = {"off": [], "on": []}
    for n, side in enumerate(("off", "on", "on", "off")):
        sections = ON if side == "on" else OFF
        async with ours(ctx, f"p1t-{n}-{side}", sections=sections) as stack:
            measured, _ = await deliver(ctx, stack, regs, ("nic",), count, timing)
        runs[side].append(measured)

    def mean(side: str, figure: Callable[[Measured], float]) -> float:
        values = [figure(m) for m in runs[side]]
        return sum(values) / len(values)

    rate_on = mean("on", lambda m: m.deliveries_per_second)
    rate_off = mean("off", lambda m: m.deliveries_per_second)
    cpu_on = mean("on", server_us_per_delivery)
    cpu_off = mean("off", server_us_per_delivery)
    result.checks.append(Check(
        "deliveries/s",
        Figure(f"publisher, trace on ({Trace().items:,} changes)", round(rate_on),
               "deliveries/s"),
        Figure("same publisher, trace: {items: 0}", round(rate_off), "deliveries/s"),
        ">= 0.95x", rate_on >= 0.95 * rate_off,
    ))
    result.checks.append(Check(
        "server CPU per delivery",
        Figure("trace on", round(cpu_on, 3), "µs"),
        Figure("trace off", round(cpu_off, 3), "µs"),
        "<= 1.05x", cpu_on <= 1.05 * cpu_off,
    ))
    items = ctx.size(Trace().items, 1000)
    full, again = trace_memory(items, 2)
    result.checks.append(Check(
        "trace memory",
        Figure(f"{items:,} changes, 2 services each", full, "bytes"),
        Figure("after as many changes again (bounded)", again, "bytes"),
        "(information)", None,
    ))
    result.details = {
        "listeners": count, **timing, "order": "off, on, on, off",
        "deliveries_per_second": {side: [round(m.deliveries_per_second) for m in ms]
                                  for side, ms in runs.items()},
        "server_cpu_us_per_delivery": {side: [server_us_per_delivery(m) for m in ms]
                                       for side, ms in runs.items()},
        "trace_bytes_per_change": round(full / items),
    }
    return result


__all__ = ["p1t", "registrations", "trace_memory"]
