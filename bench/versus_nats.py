"""P9: what a user would use instead. NATS core pub/sub (a private nats-server on a free port,
pinned to the server core like the publisher) fanning out the same 150-byte items to the same
number of Python subscribers, at full speed and at P2's rate, against this run's P1
(deliveries/s) and P2 (p99) figures of the publisher.

The subscribers are the same epoll load generators as the websocket listeners (`bench.clients`,
speaking the NATS text protocol), so both sides pay the same client cost; the items are published
with nats.py (or, without it, the same PUB commands over a plain socket).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import time
from collections.abc import Iterator
from typing import Any

from bench import items
from bench.clients import ClientPool
from bench.drive import CpuWatch, closed_loop, paced
from bench.fanout import fanout_throughput, server_us_per_delivery, throughput_timing
from bench.latency import KEPT_UP, latency_timing, receive_latency
from bench.scenario import Check, Context, Figure, Result, ScenarioError
from bench.servers import Server
from changefeed_testing.servers import free_port

FELL_BEHIND_P50_MS = 1000.0
"""A baseline whose median latency passes this did not keep up with the offered rate."""
HOST = "127.0.0.1"


@contextlib.contextmanager
def nats_server(ctx: Context) -> Iterator[tuple[int, int, str]]:
    """(port, pid, which): a private nats-server on a free port, pinned to the server core."""
    binary = shutil.which("nats-server")
    if binary is None:
        raise ScenarioError("nats-server is not on PATH")
    port = free_port()
    server = Server("nats-server", [binary, "-a", HOST, "-p", str(port)],
                    ctx.work / "nats.log", r"(?i)server is ready", ctx.cores.server)
    with server:
        yield port, server.pid, f"private nats-server on {HOST}:{port}, on the server core"


class Publisher:
    """Publishes batches of payloads to one subject: nats.py when installed, else raw PUBs."""

    def __init__(self, port: int, subject: str) -> None:
        self.port = port
        self.subject = subject
        self.client: Any = None
        self.writer: asyncio.StreamWriter | None = None
        self.kind = ""

    async def connect(self) -> None:
        try:
            import nats
        except ImportError:
            reader, self.writer = await asyncio.open_connection(HOST, self.port)
            await reader.readline()  # INFO
            self.writer.write(b'CONNECT {"verbose":false,"pedantic":false}\r\n')
            self.reader = reader
            self.kind = "raw PUB over a socket (nats-py not installed)"
            return
        self.client = await nats.connect(f"nats://{HOST}:{self.port}")
        self.kind = "nats.py"

    async def publish(self, payloads: list[bytes]) -> None:
        if self.client is not None:
            for payload in payloads:
                await self.client.publish(self.subject, payload)
            await self.client.flush()
            return
        assert self.writer is not None
        header = f"PUB {self.subject} ".encode()
        self.writer.write(b"".join(header + f"{len(p)}\r\n".encode() + p + b"\r\n"
                                   for p in payloads) + b"PING\r\n")
        await self.writer.drain()
        while not (await self.reader.readline()).startswith(b"PONG"):
            pass

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        elif self.writer is not None:
            self.writer.close()


async def _nats_figures(ctx: Context, count: int) -> dict[str, Any]:
    subject = f"bench.{os.getpid()}.items"
    timing = latency_timing(ctx)
    out: dict[str, Any] = {}
    with nats_server(ctx) as (port, pid, which):
        out["server"] = which
        pids = {"nats-server": pid}
        publisher = Publisher(port, subject)
        await publisher.connect()
        out["publisher"] = publisher.kind
        registrations = [subject.encode()] * count
        with ClientPool(ctx.specs(port, registrations, kind="nats")) as pool:
            pool.ready()
            numbers = itertools.count()

            async def push(n: int) -> None:
                ms = time.time_ns() // 1_000_000
                await publisher.publish([items.item(items.counter_id(next(numbers)), ms)
                                         for _ in range(n)])

            measured = await closed_loop(push, pool, count, CpuWatch(pids),
                                         **throughput_timing(ctx))
        out["throughput"] = {
            "deliveries_per_second": round(measured.deliveries_per_second), "cpu": measured.cpu,
            "undelivered": measured.undelivered,
            "server_cpu_us_per_delivery": server_us_per_delivery(measured, "nats-server"),
        }
        origin = time.monotonic_ns()
        specs = ctx.specs(port, registrations, latency=True, origin_ns=origin, kind="nats")
        with ClientPool(specs) as pool:
            pool.ready()

            async def send(changed_id: str) -> None:
                await publisher.publish([items.item(changed_id, time.time_ns() // 1_000_000)])

            latency = await paced(
                send, pool, CpuWatch(pids), rate=timing["rate"], warmup=timing["warmup"],
                duration=timing["duration"], origin_ns=origin,
            )
        out["latency"] = {**latency.report.histogram.summary(), "cpu": latency.cpu,
                          "rate": timing["rate"], "delivered": latency.report.frames,
                          "scheduled": round(timing["rate"] * timing["duration"] * count)}
        await publisher.close()
    return out


async def versus_nats(ctx: Context) -> Result:
    count = ctx.size(1000, 20)
    result = Result("P9", f"Against NATS core pub/sub, {count:,} subscribers")
    theirs = await _nats_figures(ctx, count)
    fanout = ctx.results.get("P1")
    if fanout is None or fanout.error:
        fanout = await fanout_throughput(ctx)
    latency = ctx.results.get("P2")
    if latency is None or latency.error:
        latency = await receive_latency(ctx)
    mine_rate = fanout.checks[0].figure.value
    mine_us = fanout.details["publisher"]["server_cpu_us_per_delivery"]
    nats_us = theirs["throughput"]["server_cpu_us_per_delivery"]
    mine_p99 = latency.details["publisher"]["p99_ms"]
    nats_rate = theirs["throughput"]["deliveries_per_second"]
    nats_p99 = theirs["latency"]["p99_ms"]
    result.details = {"subscribers": count, "nats": theirs,
                      "publisher": {"deliveries_per_second": mine_rate, "p99_ms": mine_p99,
                                    "server_cpu_us_per_delivery": mine_us,
                                    "from": "this run's P1 and P2"}}
    result.cpu = {"nats throughput": theirs["throughput"]["cpu"],
                  "nats latency": theirs["latency"]["cpu"]}
    result.checks.append(Check(
        "deliveries/s", Figure(f"publisher (P1), {count:,} listeners", mine_rate, "deliveries/s"),
        Figure(f"NATS core, {count:,} subscribers", nats_rate, "deliveries/s"),
        ">= 0.5x (within 2x)", mine_rate >= 0.5 * nats_rate,
    ))
    # NATS delivers every item in the end, but late: a median over a second means it did not
    # keep up with the offered rate, and its p99 measures its queue, not its latency.
    delivered, scheduled = theirs["latency"]["delivered"], theirs["latency"]["scheduled"]
    nats_p50 = theirs["latency"]["p50_ms"]
    kept_up = delivered >= KEPT_UP * scheduled and nats_p50 <= FELL_BEHIND_P50_MS
    result.checks.append(Check(
        "p99 latency", Figure(f"publisher (P2), {latency.details['rate']:g}/s", mine_p99, "ms"),
        Figure(f"NATS core, same rate (p50 {theirs['latency']['p50_ms']:.2f})", nats_p99, "ms"),
        "<= 2x", mine_p99 <= 2 * nats_p99 if kept_up else None,
        note="" if kept_up else (
            f"baseline fell behind: median {nats_p50:,.0f} ms, {delivered:,} of the "
            f"{scheduled:,} items due delivered"
        ),
    ))
    result.checks.append(Check(
        "server CPU per delivery", Figure("publisher (P1), pinned to one core", mine_us, "µs"),
        Figure("nats-server, pinned to the same core", nats_us, "µs"), "(information)", None,
    ))
    return result
