"""P10: 50,000 idle listeners on this machine: the publisher's RSS per listener and its idle CPU;
then each change matching 1% of them (100 change kinds), at 100 changes/s: the p99 latency.

One process may not hold 50,000 sockets here: the open-file hard limit (`ulimit -Hn`) is 20,000
and only a privileged process may raise it (the scenario raises the soft limit to it, and the
publisher fits `server.maxConnections` to it). So the publisher runs as `serve --workers N` with
N = listeners / PER_PROCESS rounded up, and the clients in as many processes, each connecting
from its own loopback address (127.0.0.2, .3...): one address has 28,232 ephemeral ports to one
server port. RSS and CPU are those of the publisher's whole process tree.
"""

from __future__ import annotations

import asyncio
import time

from bench.clients import ClientPool, raise_file_limit
from bench.latency import commit_latency
from bench.scenario import Check, Context, Figure, Result, listeners
from bench.servers import SUB_KINDS, cpu_seconds, wait_seconds
from bench.stack import ours

PER_PROCESS = 15_000
"""Sockets per process: under the 20,000 open-file limit with room for the rest."""
RATE = 100.0
SETTLE = 2.0
IDLE = 10.0
READY = 300.0
"""Seconds the clients may take to open and register every connection."""
PING_INTERVAL = 120
"""The publisher's `limits.pingInterval` here (20 s by default): a client process answers pings
only once it has opened all its connections, which takes longer than the default's 30 to 40 s
(a ping after 20 to 30 s of silence, then 10 s for the pong) with 12,000 to open. The idle CPU
includes these heartbeats."""


async def idle_crowd(ctx: Context) -> Result:
    count = ctx.size(50_000, 200)
    limit = raise_file_limit()
    processes = max(1, -(-count // PER_PROCESS))
    # Quick: 10 kinds, so that the 10 probes (5%) see some of the few changes of the run.
    kinds = ctx.size(SUB_KINDS, SUB_KINDS[:10])
    fanout = count // len(kinds)
    result = Result("P10", f"{count:,} idle listeners, then {fanout:,} matched per change at "
                           f"{ctx.size(RATE, 50.0):g} changes/s")
    registrations = listeners(count, kinds)
    sources = tuple(f"127.0.0.{2 + n}" for n in range(processes + 1))
    async with ours(ctx, "p10", workers=processes,
                    limits={"pingInterval": PING_INTERVAL}) as stack:
        await asyncio.sleep(SETTLE)
        rss0 = stack.server.rss()
        origin = time.monotonic_ns()
        specs = ctx.specs(stack.port, registrations, latency=True, origin_ns=origin,
                          sources=sources, per_worker=PER_PROCESS)
        began = time.monotonic()
        with ClientPool(specs) as pool:
            connected = pool.ready(READY)
            setup = time.monotonic() - began
            await asyncio.sleep(SETTLE)
            rss1 = stack.server.rss()
            pid = stack.server.pid
            cpu0, wait0, wall0 = cpu_seconds(pid), wait_seconds(pid), time.monotonic()
            await asyncio.sleep(ctx.size(IDLE, 1.0))
            wall = time.monotonic() - wall0
            idle_cores = (cpu_seconds(pid) - cpu0) / wall
            idle_waiting = (wait_seconds(pid) - wait0) / wall
            measured, _, _ = await commit_latency(
                ctx, stack, [], rate=ctx.size(RATE, 50.0), duration=ctx.size(10.0, 1.5),
                subs=kinds, pool=pool, origin_ns=origin,
            )
    histogram = measured.report.histogram
    per_listener = (rss1 - rss0) / count / 1024
    result.details = {
        "listeners": count, "connected": connected, "publisher_processes": processes,
        "client_processes": len(specs), "source_addresses": list(sources[: len(specs)]),
        "open_file_limit": limit, "setup_seconds": round(setup, 1),
        "publisher_rss_mib": {"before": round(rss0 / 2**20, 1), "idle": round(rss1 / 2**20, 1)},
        "idle_cores": round(idle_cores, 4), "idle_cores_waiting": round(idle_waiting, 4),
        "latency": {"p50_ms": histogram.percentile(50), "p99_ms": histogram.percentile(99),
                    "max_ms": histogram.max_us / 1000, "samples": histogram.count},
        "delivered": measured.report.frames, "due": measured.items * fanout,
        "driver_late_ms": measured.late_ms,
    }
    result.cpu = {"1% matched per change": measured.cpu}
    result.checks += [
        Check("RSS per idle listener",
              Figure(f"publisher ({processes} process{'es' * (processes > 1)}), {count:,} "
                     "idle listeners", round(per_listener, 2), "KiB/connection"),
              Figure("P5's bound", 16.0, "KiB/connection"), "<= 16 KiB", per_listener <= 16.0),
        Check("idle CPU",
              Figure(f"publisher, {count:,} idle listeners (a ping each {PING_INTERVAL} s)",
                     round(idle_cores * 100, 2), "% of a core"),
              Figure("one core", 100.0, "% of a core"), "(information)", None),
        Check("p99 latency, 1% matched",
              Figure(f"p99 (p50 {histogram.percentile(50):.2f}, max "
                     f"{histogram.max_us / 1000:.1f}), {fanout:,} listeners per change",
                     histogram.percentile(99), "ms"),
              Figure("P2's absolute bound", 20.0, "ms"), "< 20 ms",
              histogram.percentile(99) < 20.0),
    ]
    result.notes.append(
        f"{connected:,} listeners connected in {setup:.0f} s from {len(specs)} client processes "
        f"(sources {', '.join(sources[: len(specs)])}); open-file limit {limit:,} per process; "
        f"publisher RSS {rss0 / 2**20:.0f} MiB before, {rss1 / 2**20:.0f} MiB with every "
        f"listener idle; {measured.report.frames:,} of {measured.items * fanout:,} deliveries "
        f"due in the latency run arrived; the driver started its commits late by "
        f"{measured.late_ms.get('p50_ms', 0):g} ms (p50), {measured.late_ms.get('p99_ms', 0):g} "
        "ms (p99)."
    )
    return result
