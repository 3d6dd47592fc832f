"""P3: is the writer the bottleneck? Commits per second into the store and the bucket against
what Redis itself can do with the same script, and the writer's CPU against Redis's.

Three measurements, each against a baseline in the same run, all on one private redis-server (no
persistence, on the load core); the Python writers and redis-benchmark run on the server core,
and Redis is emptied before each run:

    commit_many          `commit_many` of BATCH_CALLS batches of the same BATCH changes, in a
                         loop: changes/s, the writer's CPU and Redis's CPU per change
    Redis-side bound     `redis-benchmark` (a C client) sending EVALSHA of commit.lua with the
                         same prepared batch, CLIENTS connections: what Redis does when the
                         client costs next to nothing
    single commit        `commit` awaited one at a time, against a redis-py loop of awaited
                         single XADDs (what one round trip costs in Python)

Redis's CPU is `INFO cpu` (used_cpu_sys + used_cpu_user) before and after a run; the writer's is
this process's CPU clock.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench.objects import object_id, state
from bench.scenario import Check, Context, Figure, Result
from bench.servers import pinned, redis_server, redis_url, write_config
from publisher.bucket import BATCH, COMMIT_LUA, Change, ChangeBucket, connect
from publisher.config.settings import load_config
from tests.publisher.bucket.commit_call import commit_arguments

BATCH_CALLS = 10
"""Batches per `commit_many` call: the call keeps several of them in flight, as a bulk writer
would."""
CLIENTS = 4
"""redis-benchmark's connections: enough to keep Redis busy while each waits for its reply."""
ROUNDS = 5
"""Times each run is measured, taking turns with the others."""


@dataclass(frozen=True)
class Run:
    """One measured run: changes (or commands) per second and the CPU each side spent on one."""

    per_second: float
    writer_us: float
    """The writer's CPU per change, µs (0 for redis-benchmark, which is not measured)."""
    redis_us: float
    """Redis's CPU per change, µs."""
    cores: dict[str, float]
    """Cores used (CPU seconds / wall seconds) by each side."""


async def _redis_cpu(client: aioredis.Redis) -> float:
    """CPU seconds the Redis server used so far (system and user, every thread)."""
    info: dict[str, Any] = await client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def _run(
    client: aioredis.Redis, step: Callable[[], Awaitable[int]], seconds: float
) -> Run:
    """Run `step()` (which writes and returns how many changes it wrote) for `seconds`."""
    await client.flushall()
    redis_cpu = await _redis_cpu(client)
    cpu = time.process_time()
    started = time.perf_counter()
    done = 0
    while time.perf_counter() - started < seconds:
        done += await step()
    wall = time.perf_counter() - started
    writer = time.process_time() - cpu
    redis = await _redis_cpu(client) - redis_cpu
    return Run(done / wall, writer / done * 1e6, redis / done * 1e6,
               {"driver": round(writer / wall, 3), "redis": round(redis / wall, 3)})


def _redis_benchmark(
    socket: Path, argv: list[str], requests: int, cores: frozenset[int]
) -> float:
    """Requests per second of `redis-benchmark` sending the command `argv`, CLIENTS
    connections, one request in flight on each."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        raise RuntimeError("redis-benchmark is not on PATH")
    command = [binary, "-s", str(socket), "-c", str(CLIENTS), "-n", str(requests), "-q", *argv]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300,
                         preexec_fn=lambda: os.sched_setaffinity(0, cores))
    # Not --csv: the test's name is the command, whose JSON quotes break the CSV.
    rates = re.findall(r"([\d.]+) requests per second", out.stdout)
    if not rates:
        raise RuntimeError(f"redis-benchmark said no rate: {out.stdout[-500:]}{out.stderr[-500:]}")
    return float(rates[-1])


async def _bound(
    client: aioredis.Redis, socket: Path, argv: list[str], requests: int, cores: frozenset[int]
) -> Run:
    """The Redis-side bound: redis-benchmark sending `argv` (EVALSHA of one batch) `requests`
    times."""
    await client.flushall()
    redis_cpu = await _redis_cpu(client)
    started = time.perf_counter()
    per_second = await asyncio.to_thread(_redis_benchmark, socket, argv, requests, cores)
    wall = time.perf_counter() - started
    redis = await _redis_cpu(client) - redis_cpu
    return Run(per_second * BATCH, 0.0, redis / (requests * BATCH) * 1e6,
               {"redis": round(redis / wall, 3)})


def _median(runs: list[Run]) -> Run:
    """Each figure of `runs` (rounds of one run) as its median."""
    def mid(values: list[float]) -> float:
        return statistics.median(values)

    sides = runs[0].cores
    return Run(mid([r.per_second for r in runs]), mid([r.writer_us for r in runs]),
               mid([r.redis_us for r in runs]),
               {side: round(mid([r.cores[side] for r in runs]), 3) for side in sides})


async def commit_throughput(ctx: Context) -> Result:
    result = Result("P3", "Commits/s: the writer against Redis's own bound")
    seconds = ctx.size(2.0, 0.3)
    directory = ctx.work / "p3"
    with redis_server(directory / "redis", ctx.cores.load), pinned(ctx.cores.server):
        url = redis_url(directory / "redis")
        config = load_config(write_config(directory / "config.js", url))
        client = connect(url)
        bucket = ChangeBucket(client, "bench", config.resources)
        batch = [Change.put("vm", object_id(n), ("state",), state(n)) for n in range(BATCH)]
        calls = batch * BATCH_CALLS
        states = [state(n) for n in range(BATCH)]
        single_done = 0

        async def many() -> int:
            await bucket.commit_many(calls)
            return len(calls)

        async def single() -> int:
            nonlocal single_done
            single_done += 1
            await bucket.commit("vm", object_id(single_done), ("state",),
                                states[single_done % BATCH])
            return 1

        async def xadd() -> int:
            await client.xadd("{bench}:loop", {"r": "vm", "s": '["state"]', "i": object_id(1)})
            return 1

        # The prepared batch: commit.lua's KEYS and ARGV for `batch` from a bucket that has
        # committed nothing (no witness), exactly what commit_many sends for each batch.
        keys, args = commit_arguments(ChangeBucket(client, "bench", config.resources), batch)
        sha = await client.script_load(COMMIT_LUA)
        argv = ["EVALSHA", sha, str(len(keys)), *keys,
                *(a.decode() if isinstance(a, bytes) else str(a) for a in args)]
        # The machine is shared: the four runs take turns, ROUNDS times, and each figure is the
        # median of its rounds, so a burst of someone else's load hits both sides of a ratio.
        rounds: list[dict[str, Run]] = []
        for _ in range(ctx.size(ROUNDS, 1)):
            rounds.append({
                "commit_many": await _run(client, many, seconds),
                "redis-benchmark EVALSHA": await _bound(
                    client, directory / "redis" / "redis.sock", argv, ctx.size(1200, 20),
                    ctx.cores.server),
                "single commit": await _run(client, single, seconds),
                "redis-py XADD loop": await _run(client, xadd, seconds),
            })
        await client.aclose()
    runs = {name: _median([r[name] for r in rounds]) for name in rounds[0]}
    spreads = {
        "writer/Redis CPU": [r["commit_many"].writer_us / r["commit_many"].redis_us
                             for r in rounds],
        "commit_many/bound": [r["commit_many"].per_second
                              / r["redis-benchmark EVALSHA"].per_second for r in rounds],
        "single/XADD loop": [r["single commit"].per_second
                             / r["redis-py XADD loop"].per_second for r in rounds],
    }
    result.cpu = {name: run.cores for name, run in runs.items()}
    result.details = {
        "rounds": len(rounds), "seconds_each": seconds,
        "ratio_per_round": {k: [round(v, 3) for v in vs] for k, vs in spreads.items()},
        "batch": BATCH, "batches_per_call": BATCH_CALLS,
        "redis_benchmark_clients": CLIENTS,
        "per_second": {name: round(run.per_second) for name, run in runs.items()},
        "writer_cpu_us_per_change": {name: round(run.writer_us, 2) for name, run in runs.items()
                                     if run.writer_us},
        "redis_cpu_us_per_change": {name: round(run.redis_us, 2) for name, run in runs.items()},
    }
    many_run, bound = runs["commit_many"], runs["redis-benchmark EVALSHA"]
    one, loop = runs["single commit"], runs["redis-py XADD loop"]
    label = f"commit_many, {BATCH_CALLS} batches of {BATCH} per call"
    result.checks += [
        Check("writer CPU per change",
              Figure(f"{label}: writer", round(many_run.writer_us, 2), "µs"),
              Figure("Redis, same run", round(many_run.redis_us, 2), "µs"),
              "<= 1x", many_run.writer_us <= many_run.redis_us),
        Check("batched commits/s", Figure(label, round(many_run.per_second), "changes/s"),
              Figure(f"redis-benchmark EVALSHA of the same batch ({CLIENTS} clients)",
                     round(bound.per_second), "changes/s"),
              ">= 0.6x", many_run.per_second >= 0.6 * bound.per_second),
        Check("single commits/s", Figure("commit, one await each", round(one.per_second),
                                         "changes/s"),
              Figure("redis-py loop, one await per XADD", round(loop.per_second), "XADD/s"),
              ">= 0.8x", one.per_second >= 0.8 * loop.per_second),
        Check("Redis CPU per change",
              Figure("commit_many", round(many_run.redis_us, 2), "µs"),
              Figure("redis-benchmark EVALSHA", round(bound.redis_us, 2), "µs"),
              "(information)", None),
    ]
    result.notes.append(
        f"Medians of {len(rounds)} rounds (each run {seconds:g} s, the four taking turns); the "
        "ratios per round: " + "; ".join(
            f"{name} {min(vs):.3f}-{max(vs):.3f}" for name, vs in spreads.items()) + ".")
    result.notes.append(
        f"CPU per change: commit_many's writer {many_run.writer_us:.2f} µs, Redis "
        f"{many_run.redis_us:.2f} µs (under redis-benchmark {bound.redis_us:.2f} µs); single "
        f"commit: writer {one.writer_us:.1f} µs, Redis {one.redis_us:.1f} µs; redis-py XADD loop: "
        f"writer {loop.writer_us:.1f} µs, Redis {loop.redis_us:.1f} µs.")
    return result
