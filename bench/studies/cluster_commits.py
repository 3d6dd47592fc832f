"""Commits into a bucket in a Redis Cluster against the same commits into one Redis, same run.

    python -m bench.studies.cluster_commits [--rounds 3]

Starts one redis-server and a 3-master Redis Cluster (the test fixtures' servers, loopback TCP,
no persistence) and measures, taking turns, ROUNDS times each:

    bulk     `commit_many` of CALLS x BATCH puts of distinct ids (8 partitions): changes/s
    single   `commit` awaited one at a time: commits/s (one round trip each; the cluster's
             client adds its routing)

and prints the medians and the cluster / single-Redis ratios. On one machine the three masters
share its cores with the writer, so this measures the client and the per-partition split, not
the cluster's added capacity (that needs masters on their own machines).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from changefeed.protocol import Resource
from changefeed_testing.servers import RedisCluster, RedisServer
from publisher.bucket import BATCH, Change, ChangeBucket, connect

CALLS = 10
SINGLE = 500
PARTITIONS = 8
RESOURCES = [Resource("vm", ("nic",), "/vms")]


async def bulk(bucket: ChangeBucket, round: int) -> float:
    changes = [Change.put("vm", f"vm-{round}-{n}", ["nic"], {"n": n})
               for n in range(CALLS * BATCH)]
    started = time.perf_counter()
    await bucket.commit_many(changes)
    return len(changes) / (time.perf_counter() - started)


async def single(bucket: ChangeBucket, round: int) -> float:
    started = time.perf_counter()
    for n in range(SINGLE):
        await bucket.commit("vm", f"one-{round}-{n}", ["nic"], {"n": n})
    return SINGLE / (time.perf_counter() - started)


async def measure(single_url: str, cluster_url: str, rounds: int) -> None:
    buckets = {
        "one Redis": ChangeBucket(connect(single_url), "bench", RESOURCES, PARTITIONS),
        "3-master cluster": ChangeBucket(connect(cluster_url), "bench", RESOURCES, PARTITIONS),
    }
    runs: dict[tuple[str, str], list[float]] = {}
    tests: dict[str, Callable[[ChangeBucket, int], Awaitable[float]]] = {
        "bulk changes/s": bulk, "single commits/s": single,
    }
    try:
        for round in range(rounds):
            for test, run in tests.items():
                for name, bucket in buckets.items():
                    runs.setdefault((test, name), []).append(await run(bucket, round))
    finally:
        for bucket in buckets.values():
            await bucket.aclose()
    for test in tests:
        one = statistics.median(runs[(test, "one Redis")])
        cluster = statistics.median(runs[(test, "3-master cluster")])
        print(f"{test:18} one Redis {one:9.0f}   3-master cluster {cluster:9.0f}   "
              f"ratio {cluster / one:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        server = RedisServer(root / "one", tcp=True, persist=False).start()
        cluster = RedisCluster(root / "cluster").start()
        try:
            asyncio.run(measure(server.url, cluster.url, rounds))
        finally:
            cluster.stop()
            server.stop()


if __name__ == "__main__":
    main()
