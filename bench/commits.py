"""P3: commits per second into the store and the bucket, one at a time and in batches of 500,
against `redis-benchmark -P 16` XADD and a one-await-per-command redis-py XADD loop.

Every side writes to the same private redis-server (no persistence, on the load core); the Python
writers and redis-benchmark run on the server core. Redis is emptied between the runs.
"""

from __future__ import annotations

import asyncio
import csv
import io
import os
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.objects import object_id, state
from bench.scenario import Check, Context, Figure, Result
from bench.servers import cpu_seconds, pinned, redis_server, redis_url, write_config
from publisher.bucket import BATCH, Change, ChangeBucket, connect
from publisher.config import load_config


async def _rate(
    step: Callable[[int], Awaitable[int]], seconds: float
) -> tuple[float, float, float]:
    """Run `step(n)` (which writes and returns how many changes it wrote) for `seconds`;
    (changes per second, driver CPU share, wall seconds it took)."""
    done = 0
    cpu = time.process_time()
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        done += await step(done)
    wall = time.perf_counter() - started
    return done / wall, (time.process_time() - cpu) / wall, wall


def redis_benchmark(socket: Path, requests: int, cores: frozenset[int]) -> float:
    """XADD requests per second from `redis-benchmark -P 16` (50 clients)."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        raise RuntimeError("redis-benchmark is not on PATH")
    argv = [binary, "-s", str(socket), "-P", "16", "-n", str(requests), "--csv",
            "XADD", "{bench}:rb", "*", "r", "vm", "s", '["state"]', "i", object_id(1)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300,
                         preexec_fn=lambda: os.sched_setaffinity(0, cores))
    rows = [row for row in csv.reader(io.StringIO(out.stdout)) if len(row) > 1]
    return float(rows[-1][1])


async def p3(ctx: Context) -> Result:
    result = Result("P3", "Commits/s into store + bucket, single and batched")
    seconds = ctx.size(5.0, 0.5)
    directory = ctx.work / "p3"
    with redis_server(directory / "redis", ctx.cores.load) as redis, pinned(ctx.cores.server):
        url = redis_url(directory / "redis")
        config = load_config(write_config(directory / "config.js", url))
        client = connect(url)
        bucket = ChangeBucket(client, "bench", config.resources)
        states = [state(n) for n in range(BATCH)]

        async def single(done: int) -> int:
            await bucket.commit("vm", object_id(done), ("state",), states[done % BATCH])
            return 1

        async def batched(done: int) -> int:
            await bucket.commit_many(
                Change.put("vm", object_id(done + n), ("state",), states[n]) for n in range(BATCH)
            )
            return BATCH

        async def xadd(done: int) -> int:
            await client.xadd("{bench}:loop", {"r": "vm", "s": '["state"]', "i": object_id(done)})
            return 1

        rates: dict[str, float] = {}
        cpu: dict[str, dict[str, float]] = {}
        for name, step in (("single commit", single), ("commit_many", batched),
                           ("redis-py XADD loop", xadd)):
            await client.flushall()
            redis_cpu = cpu_seconds(redis.pid)
            rates[name], driver, wall = await _rate(step, seconds)
            cpu[name] = {"driver": round(driver, 3),
                         "redis": round((cpu_seconds(redis.pid) - redis_cpu) / wall, 3)}
        await client.flushall()
        await client.aclose()
        redis_cpu = cpu_seconds(redis.pid)
        started = time.perf_counter()
        rates["redis-benchmark -P 16 XADD"] = await asyncio.to_thread(
            redis_benchmark, directory / "redis" / "redis.sock", ctx.size(500_000, 20_000),
            ctx.cores.server,
        )
        wall = time.perf_counter() - started
        cpu["redis-benchmark -P 16 XADD"] = {
            "redis": round((cpu_seconds(redis.pid) - redis_cpu) / wall, 3)}
    result.cpu = cpu
    redis_us = {name: round(cpu[name]["redis"] / rates[name] * 1e6, 2) for name in rates}
    result.details = {"seconds_each": seconds, "batch": BATCH,
                      "per_second": {k: round(v) for k, v in rates.items()},
                      "redis_cpu_us_per_write": redis_us}
    many, one, loop = rates["commit_many"], rates["single commit"], rates["redis-py XADD loop"]
    bench = rates["redis-benchmark -P 16 XADD"]
    result.checks += [
        Check("batched commits/s",
              Figure(f"commit_many, {BATCH} per call", round(many), "changes/s"),
              Figure("redis-benchmark -P 16 XADD (50 clients)", round(bench), "XADD/s"),
              ">= 0.4x", many >= 0.4 * bench),
        Check("batched commits/s",
              Figure(f"commit_many, {BATCH} per call", round(many), "changes/s"),
              Figure("redis-py loop, one await per XADD", round(loop), "XADD/s"),
              ">= 5x", many >= 5 * loop),
        Check("single commits/s", Figure("commit, one await each", round(one), "changes/s"),
              Figure("redis-py loop, one await per XADD", round(loop), "XADD/s"),
              "(information)", None),
    ]
    bound = redis_us["redis-benchmark -P 16 XADD"] / redis_us["commit_many"]
    result.notes.append(
        f"Redis CPU per write: {redis_us['commit_many']} µs per committed change (HSET + ZADD + "
        f"XADD in one script) against {redis_us['redis-benchmark -P 16 XADD']} µs per "
        f"pipelined XADD, so even a client that cost nothing could reach {bound:.2f}x of "
        "redis-benchmark on one Redis core.")
    return result
