"""P1T: what the delivery trace (publisher.delivery.trace) costs.

First `Hub.publish` alone, in this process, to 1,000 connections of two services (transports that
take every write): CPU per delivery with a trace against without, interleaved, best of 5, at 10
changes per batch (P1's load) and at one. Then P1's real fan-out (publisher, Redis, 1,000
websocket clients) with trace recording on (the default `trace` section) against the same
publisher with `trace: {items: 0}`, same clients, same run, in the order off, on, on, off, off,
on (each side's figure is the mean of its three runs); on a shared machine these vary more
between runs than the trace costs, so they are information. Also the memory a full trace
holds, measured with tracemalloc.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import orjson

from bench.drive import Measured
from bench.fanout import deliver, server_us_per_delivery, throughput_timing
from bench.scenario import Check, Context, Figure, Result
from bench.stack import ours
from bench.transports import CountingTransport
from changefeed.cursor import StreamId
from changefeed.protocol import ChangeKind, Registration
from publisher.bucket import LogEntry
from publisher.config.settings import Trace
from publisher.delivery.hub import Hub, Subscriber
from publisher.delivery.trace import TraceLog
from publisher.delivery.window import Window

ORDER = ("off", "on", "on", "off", "off", "on")
"""The real publisher's runs: each side as often early and late in the run."""
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


def hub_seconds_per_delivery(traced: bool, listeners: int, batch: int, batches: int) -> float:
    """CPU seconds `Hub.publish` spends per delivery in this process, to `listeners` fake
    transports of two services, `batch` entries per call: the fan-out alone, no sockets."""
    hub = Hub(Window(10_000, StreamId(0, 0)), None, 1 << 20)  # type: ignore[arg-type]
    hub.epoch = "bencheepoch"
    hub.fanout.trace_with(TraceLog(Trace().items, None) if traced else None)
    kind = ChangeKind("vm", ("nic",))
    for n in range(listeners):
        registration = Registration(f"i{n}", ("bench", "billing")[n % 2], (kind,), 1)
        hub.add(Subscriber(registration, CountingTransport(), None, "127.0.0.1"))
    ms = 1_700_000_000_000
    started = time.process_time()
    for _ in range(batches):
        hub.fan_out([LogEntry(StreamId(ms, seq), "vm", ("nic",), f"vm-{seq}")
                     for seq in range(batch)])
        ms += 1
    return (time.process_time() - started) / (listeners * batch * batches)


class _Registration:
    __slots__ = ("service",)

    def __init__(self, service: str) -> None:
        self.service = service


class _Conn:
    __slots__ = ("registration",)

    def __init__(self, service: str) -> None:
        self.registration = _Registration(service)


class _Queued:
    __slots__ = ("frames",)

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = frames


def trace_memory(items: int, services: int) -> tuple[int, int]:
    """Bytes a full trace of `items` changes, each written to `services` services, holds; and
    what it holds after as many again (the bound)."""
    trace = TraceLog(items, None)
    tracemalloc.start()
    try:
        for phase in range(2):
            for n in range(items):
                entry = _Entry(StreamId(1_700_000_000_000 + phase * items + n, 0))
                writes = {_Conn(f"service-{s}"): _Queued([entry.frame]) for s in range(services)}
                trace.published("bencheepoch", [entry], writes, services, 1.0, 1.0)
            if phase == 0:
                full, _ = tracemalloc.get_traced_memory()
        again, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return full, again


async def trace_cost(ctx: Context) -> Result:
    count = ctx.size(1000, 20)
    result = Result("P1T", f"Delivery trace cost: P1's fan-out to {count:,} listeners, trace "
                           "recording on against off")
    timing = throughput_timing(ctx)
    regs = registrations(count)
    runs: dict[str, list[Measured]] = {"off": [], "on": []}
    for n, side in enumerate(ORDER):
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
    # The fan-out alone, in this process: the same Hub.publish with and without a trace,
    # interleaved, best of 5 each (a shared machine's noise only ever adds time).
    hub: dict[tuple[int, bool], list[float]] = {}
    for _ in range(ctx.size(5, 1)):
        for batch, batches in ((10, ctx.size(300, 5)), (1, ctx.size(1500, 20))):
            for traced in (False, True):
                hub.setdefault((batch, traced), []).append(
                    hub_seconds_per_delivery(traced, count, batch, batches) * 1e6)
    for batch, what in ((10, "10 changes per batch (P1's load)"), (1, "one change per batch")):
        on, off = min(hub[batch, True]), min(hub[batch, False])
        result.checks.append(Check(
            f"Hub.publish CPU per delivery, {what}",
            Figure(f"trace on, {count:,} listeners (in-process, no sockets)", round(on, 4), "µs"),
            Figure("trace off", round(off, 4), "µs"),
            "<= 1.1x" if batch == 10 else "(information)",
            on <= 1.1 * off if batch == 10 else None,
        ))
    result.checks.append(Check(
        "deliveries/s, real publisher (noisy: see details)",
        Figure(f"publisher, trace on ({Trace().items:,} changes)", round(rate_on),
               "deliveries/s"),
        Figure("same publisher, trace: {items: 0}", round(rate_off), "deliveries/s"),
        "(information)", None,
    ))
    result.checks.append(Check(
        "server CPU per delivery, real publisher",
        Figure("trace on", round(cpu_on, 3), "µs"),
        Figure("trace off", round(cpu_off, 3), "µs"),
        "(information)", None,
    ))
    items = ctx.size(Trace().items, 1000)
    full, again = trace_memory(items, 2)
    result.checks.append(Check(
        "trace memory",
        Figure(f"{items:,} changes, 2 services each", full, "bytes"),
        Figure("after as many changes again (bounded)", again, "bytes"),
        "(information)", None,
    ))
    worst, _ = trace_memory(items, 100)
    result.checks.append(Check(
        "trace memory, worst case",
        Figure(f"{items:,} changes, each written to 100 services", worst, "bytes"),
        Figure("2 services each", full, "bytes"),
        "(information)", None,
    ))
    result.details = {
        "listeners": count, **timing, "order": ", ".join(ORDER),
        "deliveries_per_second": {side: [round(m.deliveries_per_second) for m in ms]
                                  for side, ms in runs.items()},
        "server_cpu_us_per_delivery": {side: [server_us_per_delivery(m) for m in ms]
                                       for side, ms in runs.items()},
        "trace_bytes_per_change": round(full / items),
        "hub_publish_us_per_delivery": {
            f"batch {batch}, trace {'on' if traced else 'off'}": [round(v, 4) for v in values]
            for (batch, traced), values in hub.items()},
    }
    return result


__all__ = ["hub_seconds_per_delivery", "registrations", "trace_cost", "trace_memory"]
