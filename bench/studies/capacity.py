"""What one Redis shard costs per change: the inputs of docs/scaling.md's arithmetic.

`python -m bench.studies.capacity` measures, on one private redis-server (no persistence), with the
project's own `ChangeBucket`:

    log bytes per change        used_memory grown by LOG_CHANGES publishes (no state), per change:
                                what the retained log costs in Redis memory
    store bytes per object      used_memory grown by OBJECTS puts of distinct ids with a VM's
                                state (bench/objects.py, about 200 bytes of JSON), per object,
                                minus the log part: what the authoritative store costs
    Redis µs per single commit  Redis's CPU (INFO cpu) per awaited one-change `commit`
    Redis µs per batched change Redis's CPU per change of `commit_many` batches
    Redis µs per change read    Redis's CPU per change for one publisher's tail reading the log
                                in pages of 1,000 (what each extra publisher adds)

and prints them as JSON. They are figures of this machine and this Redis version; the
arithmetic that uses them says so.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench.machine import describe
from bench.objects import object_id, state
from bench.servers import redis_server, redis_url
from changefeed.cursor import ZERO
from publisher.bucket import Change, ChangeBucket, connect

LOG_CHANGES = 100_000
OBJECTS = 50_000
SINGLE_COMMITS = 5_000
BATCH = 500
READ_PAGE = 1_000


async def _cpu(client: aioredis.Redis) -> float:
    info: dict[str, Any] = await client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def _memory(client: aioredis.Redis) -> int:
    info: dict[str, Any] = await client.info("memory")
    return int(info["used_memory"])


async def measure(url: str) -> dict[str, float]:
    client = aioredis.Redis.from_url(url)
    bucket = ChangeBucket(connect(url), "capacity")
    try:
        await bucket.log.ensure()
        before = await _memory(client)
        changes = [Change("vm", object_id(n % 1000), ("nic",)) for n in range(LOG_CHANGES)]
        for start in range(0, LOG_CHANGES, BATCH * 10):
            await bucket.commit_many(changes[start:start + BATCH * 10])
        log_bytes = (await _memory(client) - before) / LOG_CHANGES

        cpu = await _cpu(client)
        started = time.perf_counter()
        after, read = ZERO, 0
        while True:
            page = await bucket.log.read(after, count=READ_PAGE)
            if not page:
                break
            read += len(page)
            after = page[-1].position
        read_us = (await _cpu(client) - cpu) / read * 1e6
        read_seconds = time.perf_counter() - started

        await client.flushall()
        await bucket.log.ensure()
        before = await _memory(client)
        puts = [Change.put("vm", object_id(n), ("state",), state(n)) for n in range(OBJECTS)]
        cpu = await _cpu(client)
        for start in range(0, OBJECTS, BATCH * 10):
            await bucket.commit_many(puts[start:start + BATCH * 10])
        batched_us = (await _cpu(client) - cpu) / OBJECTS * 1e6
        store_bytes = (await _memory(client) - before) / OBJECTS - log_bytes

        cpu = await _cpu(client)
        started = time.perf_counter()
        for n in range(SINGLE_COMMITS):
            await bucket.commit("vm", object_id(n), ["state"], state(n))
        single_seconds = time.perf_counter() - started
        single_us = (await _cpu(client) - cpu) / SINGLE_COMMITS * 1e6
    finally:
        await bucket.aclose()
        await client.aclose()
    return {
        "log_bytes_per_change": round(log_bytes, 1),
        "store_bytes_per_object": round(store_bytes, 1),
        "redis_us_per_single_commit": round(single_us, 2),
        "single_commits_per_s_one_connection": round(SINGLE_COMMITS / single_seconds),
        "redis_us_per_batched_change": round(batched_us, 2),
        "redis_us_per_change_read": round(read_us, 3),
        "changes_read_per_s_one_reader": round(read / read_seconds),
    }


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="cfcap", dir="/tmp") as name:
        directory = Path(name)
        with redis_server(directory, None):
            figures = asyncio.run(measure(redis_url(directory)))
    machine = describe()
    shown = {k: machine[k] for k in ("cores", "cpu", "redis", "load_average")}
    json.dump({"figures": figures, "machine": shown}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
