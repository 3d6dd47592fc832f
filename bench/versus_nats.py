"""P9: what a user would use instead. NATS core pub/sub (the machine's nats-server) fanning out
the same 150-byte items to the same number of Python subscribers, at full speed and at P2's rate,
against this run's P1 (deliveries/s) and P2 (p99) figures of the publisher.

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
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import items
from bench.clients import ClientPool
from bench.drive import CpuWatch, closed_loop, paced
from bench.fanout import p1
from bench.latency import latency_timing, p2
from bench.scenario import Check, Context, Figure, Result
from bench.servers import Server

HOST, PORT = "127.0.0.1", 4222


def _reachable(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1):
        return True
    return False


def _pid_of(name: str) -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == name:
                    return int(entry.name)
    return None


@contextlib.contextmanager
def nats_server(ctx: Context) -> Iterator[tuple[int, int | None, str]]:
    """(port, pid, which): the running nats-server, else a private one."""
    if _reachable(PORT):
        yield PORT, _pid_of("nats-server"), f"running nats-server on {HOST}:{PORT}"
        return
    binary = shutil.which("nats-server")
    if binary is None:
        raise RuntimeError("no nats-server on 127.0.0.1:4222 and none on PATH")
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]
    server = Server("nats-server", [binary, "-a", HOST, "-p", str(port)],
                    ctx.work / "nats.log", r"(?i)server is ready", None)
    with server:
        yield port, server.pid, f"private nats-server on {HOST}:{port} (none was running)"


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
        pids = {"nats-server": pid} if pid else {}
        publisher = Publisher(port, subject)
        await publisher.connect()
        out["publisher"] = publisher.kind
        registrations = [subject.encode()] * count
        with ClientPool(ctx.specs(port, registrations, kind="nats")) as pool:
            pool.ready()
            numbers = itertools.count()

            async def push(n: int) -> None:
                await publisher.publish([
                    items.item_json("vm", ["nic"], items.counter_id(next(numbers)), 0,
                                    items.fake_cursor(0, 1))
                    for _ in range(n)
                ])

            measured = await closed_loop(
                push, pool, count, CpuWatch(pids), batch=ctx.size(10, 5),
                inflight=ctx.size(50, 50), warmup=ctx.size(2.0, 0.5),
                duration=ctx.size(10.0, 1.5),
            )
        rate = measured.deliveries_per_second
        out["throughput"] = {
            "deliveries_per_second": round(rate), "cpu": measured.cpu,
            "undelivered": measured.undelivered,
            "server_cpu_us_per_delivery":
                round(measured.cpu.get("nats-server", 0.0) / rate * 1e6, 3) if rate else 0.0,
        }
        origin = time.monotonic_ns()
        specs = ctx.specs(port, registrations, latency=True, origin_ns=origin, kind="nats")
        with ClientPool(specs) as pool:
            pool.ready()

            async def send(changed_id: str) -> None:
                await publisher.publish([items.item_json("vm", ["nic"], changed_id, 0,
                                                         items.fake_cursor(0, 1))])

            latency = await paced(
                send, pool, CpuWatch(pids), rate=timing["rate"], warmup=timing["warmup"],
                duration=timing["duration"], stamp=lambda: items.stamp(time.monotonic_ns(), origin),
            )
        out["latency"] = {**latency.report.histogram.summary(), "cpu": latency.cpu,
                          "rate": timing["rate"]}
        await publisher.close()
    return out


async def p9(ctx: Context) -> Result:
    count = ctx.size(1000, 20)
    result = Result("P9", f"Against NATS core pub/sub, {count:,} subscribers")
    theirs = await _nats_figures(ctx, count)
    fanout = ctx.results.get("P1")
    if fanout is None or fanout.error:
        fanout = await p1(ctx)
    latency = ctx.results.get("P2")
    if latency is None or latency.error:
        latency = await p2(ctx)
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
    result.checks.append(Check(
        "p99 latency", Figure(f"publisher (P2), {latency.details['rate']:g}/s", mine_p99, "ms"),
        Figure(f"NATS core, same rate (p50 {theirs['latency']['p50_ms']:.2f})", nats_p99, "ms"),
        "<= 2x", mine_p99 <= 2 * nats_p99,
    ))
    result.checks.append(Check(
        "server CPU per delivery", Figure("publisher (P1), pinned to one core", mine_us, "µs"),
        Figure("nats-server (not pinned: not ours)", nats_us, "µs"), "(information)", None,
    ))
    return result
