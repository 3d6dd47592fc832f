"""P5: resident memory per idle listener at 1,000, 5,000 and 10,000 connections, ours against a
bare websockets server holding the same clients.

Connections are added in steps to one server process; after each step the server's RSS is read
(after a short settle), and the cost per connection is (RSS - RSS before any) / connections.
"""

from __future__ import annotations

import asyncio
import contextlib

from bench.clients import ClientPool
from bench.scenario import Check, Context, Figure, Result, listeners
from bench.servers import Server
from bench.stack import bare, ours

SETTLE = 1.0


async def _steps(ctx: Context, server: Server, port: int, steps: list[int]) -> dict[int, int]:
    """RSS after each step (key 0: before any connection)."""
    await asyncio.sleep(SETTLE)
    rss = {0: server.rss()}
    everyone = listeners(steps[-1])
    with contextlib.ExitStack() as pools:
        done = 0
        for step in steps:
            pool = pools.enter_context(ClientPool(ctx.specs(port, everyone[done:step])))
            pool.ready()
            done = step
            await asyncio.sleep(SETTLE)
            rss[step] = server.rss()
    return rss


async def idle_memory(ctx: Context) -> Result:
    steps = ctx.size([1000, 5000, 10_000], [20, 50, 100])
    result = Result("P5", "Idle listeners: RSS per connection")
    async with ours(ctx, "p5-ours") as stack:
        mine = await _steps(ctx, stack.server, stack.port, steps)
    with bare(ctx, "p5-bare", "idle") as stack:
        base = await _steps(ctx, stack.server, stack.port, steps)

    def per_connection(rss: dict[int, int], step: int) -> float:
        return (rss[step] - rss[0]) / step / 1024

    result.details = {
        "rss_mib": {"publisher": {k: round(v / 2**20, 1) for k, v in mine.items()},
                    "bare websockets": {k: round(v / 2**20, 1) for k, v in base.items()}},
        "kib_per_connection": {
            "publisher": {s: round(per_connection(mine, s), 2) for s in steps},
            "bare websockets": {s: round(per_connection(base, s), 2) for s in steps},
        },
    }
    for step in steps:
        mine_kib, base_kib = per_connection(mine, step), per_connection(base, step)
        result.checks.append(Check(
            f"RSS per connection at {step:,}",
            Figure(f"publisher, {step:,} idle listeners", round(mine_kib, 2), "KiB/connection"),
            Figure("bare websockets server, same clients", round(base_kib, 2), "KiB/connection"),
            "<= 1.0x and <= 16 KiB", mine_kib <= base_kib and mine_kib <= 16,
        ))
    return result
