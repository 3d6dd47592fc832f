"""A loop of awaited single commits (or redis-py XADDs) on a private Redis, to profile the writer:

    py-spy record -r 500 -f raw -o commit.txt -- python -m bench.studies.commit_loop commit 20000
    python -m bench.studies.commit_loop xadd 20000

It prints the CPU and wall time per call, and Redis's CPU per call (its command statistics).
P3 measures the same two loops' rates side by side;
this is what to put under a profiler when the single commit's ratio is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from bench.servers import RESOURCE, redis_server, redis_url
from publisher.bucket import ChangeBucket, connect


async def loop(url: str, what: str, count: int) -> tuple[float, float, float]:
    """(CPU µs, wall µs, Redis's CPU µs) per call of `count` awaited commits or XADDs; Redis's
    from its `INFO commandstats` (EVALSHA's, or XADD's, usec_per_call)."""
    client = connect(url)
    bucket = ChangeBucket(client, "loop", [RESOURCE])
    await bucket.commit("vm", "warm", ("nic",), {"uuid": "warm"})
    cpu, wall = time.process_time(), time.perf_counter()
    if what == "commit":
        for number in range(count):
            await bucket.commit("vm", f"id{number}", ("nic",), {"uuid": "bench"})
    else:
        for number in range(count):
            await client.xadd("loop", {"r": "vm", "i": f"id{number}", "s": '["nic"]'})
    done = ((time.process_time() - cpu) / count * 1e6, (time.perf_counter() - wall) / count * 1e6)
    stats = await client.info("commandstats")
    command = "cmdstat_evalsha" if what == "commit" else "cmdstat_xadd"
    await bucket.aclose()
    return (*done, float(stats[command]["usec_per_call"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["commit", "xadd"])
    parser.add_argument("count", type=int, nargs="?", default=20_000)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="commit-loop-"))
    with redis_server(directory / "redis", None):
        cpu, wall, redis = asyncio.run(
            loop(redis_url(directory / "redis"), args.what, args.count)
        )
    print(f"{args.what}: {cpu:.0f} µs of CPU, {wall:.0f} µs wall, {redis:.1f} µs of Redis's CPU "
          "per call")


if __name__ == "__main__":
    main()
