"""The capture's throughput and the cost of a transaction at once (docs/capture.md#measured):

    rows/s     row changes streamed from PostgreSQL into the bucket with transactions of 1 and
               of 1,000 rows (written while no capture runs; from a capture's start until it
               applied the last), against `commit_many`'s own rate (the bucket alone)
    latency    COMMIT of a 1-row transaction -> applied in the bucket (p50, p99), one at a time,
               against a direct bucket commit's round trip (`ChangeBucket.commit`)
    longest    Redis's longest command while the capture streamed (SLOWLOG): how long it served
               no other client at once; and this process's peak RSS (the capture runs in it)
    one call   the single script call a transaction of 1,000 and of 100,000 rows becomes: how
               long Redis is busy with it (no other client is served meanwhile)

    python -m bench.capture                       # 20,000 rows each way
    python -m bench.capture --rows 5000 --big 20000   # a small run

Every server is private and started here: redis-server, PostgreSQL (initdb, wal_level logical);
the capture runs in this process (a CaptureRunner on its own bucket client).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from changefeed.protocol import Resource
from changefeed_testing.postgres import PostgresServer
from changefeed_testing.servers import RedisServer
from publisher.bucket import Change, ChangeBucket, connect
from publisher.capture import database
from publisher.capture.install import install
from publisher.capture.runner import CaptureRunner
from publisher.config.capture import parse_capture

RESOURCES = [Resource("vm", ("nic", "alias", "state"), "/vms")]
TABLE = "CREATE TABLE vms (uuid text PRIMARY KEY, seq int NOT NULL, alias text, nics jsonb)"
STATE = {"uuid": "", "seq": 0, "alias": "web-frontend-01", "nics": [{"mac": "90:b8:d0:00:00:01"}]}


def cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


CPU: dict[int, float] = {}
"""Per transaction size: this process's CPU µs per row while the capture streamed (what bounds
its rate on an idle machine; the wall-clock rate swings with the other engineers' load)."""


async def streamed(url: str, start: Any, rows: int, per_txn: int) -> float:
    """Row changes/s the capture streams: `rows` inserted in transactions of `per_txn` while no
    capture runs (the slot keeps them), then a capture started (`start()`) and timed until it
    applied them all: the capture's rate, not the writer's (its CPU per row in `CPU`)."""
    conn = await asyncpg.connect(url)
    try:
        for first in range(0, rows, per_txn):
            async with conn.transaction():
                await conn.executemany(
                    "INSERT INTO vms (uuid, seq, alias, nics) VALUES ($1, $2, $3, $4)",
                    [(f"vm-{per_txn}-{n}", n, STATE["alias"], json.dumps(STATE["nics"]))
                     for n in range(first, min(rows, first + per_txn))])
    finally:
        await conn.close()
    started, cpu = time.perf_counter(), cpu_seconds()
    runner = start()
    try:
        while runner.stats.rows < rows:  # noqa: ASYNC110 - the stats are polled
            await asyncio.sleep(0.002)
        CPU[per_txn] = round((cpu_seconds() - cpu) / rows * 1e6, 1)
        return rows / (time.perf_counter() - started)
    finally:
        await runner.stop()


async def latency(url: str, bucket: ChangeBucket, start: Any, count: int) -> dict[str, float]:
    """COMMIT -> applied in the bucket, ms (p50, p99), one 1-row transaction at a time (the
    capture's stats polled every 0.2 ms), against a direct `ChangeBucket.commit`'s round trip."""
    runner = start()
    conn = await asyncpg.connect(url)
    captured, direct = [], []
    try:
        while runner.stats.copies == 0 and not runner.stats.streaming:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        for n in range(count):
            before = runner.stats.transactions
            await conn.execute("INSERT INTO vms (uuid, seq) VALUES ($1, $2)", f"lat-{n}", n)
            committed = time.perf_counter()
            while runner.stats.transactions == before:  # noqa: ASYNC110 - polled
                await asyncio.sleep(0.0002)
            captured.append(time.perf_counter() - committed)
            started = time.perf_counter()
            await bucket.commit("vm", f"direct-{n}", ["state"], {"uuid": f"direct-{n}"})
            direct.append(time.perf_counter() - started)
    finally:
        await conn.close()
        await runner.stop()

    def q(values: list[float], at: float) -> float:
        return round(sorted(values)[min(len(values) - 1, int(len(values) * at))] * 1000, 3)

    return {"capture_p50_ms": q(captured, 0.5), "capture_p99_ms": q(captured, 0.99),
            "direct_p50_ms": q(direct, 0.5), "direct_p99_ms": q(direct, 0.99)}


async def commit_many_rate(bucket: ChangeBucket, rows: int) -> float:
    changes = [Change.put("vm", f"cm-{n}", ["nic", "alias", "state"],
                          {**STATE, "uuid": f"cm-{n}", "seq": n}) for n in range(rows)]
    started = time.perf_counter()
    await bucket.commit_many(changes)
    return rows / (time.perf_counter() - started)


async def one_call(bucket: ChangeBucket, rows: int) -> float:
    """Seconds of the one script call a transaction of `rows` puts becomes."""
    changes = [Change.put("vm", f"one-{rows}-{n}", ["state"], {**STATE, "uuid": str(n)})
               for n in range(rows)]
    started = time.perf_counter()
    await bucket.log.commit_batches([(changes, f"bench-{rows}")])
    return time.perf_counter() - started


async def longest_call(bucket: ChangeBucket) -> float:
    """Ms of Redis's longest command since the last look (its SLOWLOG, then reset): how long
    Redis served no other client at once."""
    entries = await bucket.redis.slowlog_get(128)
    await bucket.redis.slowlog_reset()
    return round(max((int(e["duration"]) for e in entries), default=0) / 1000, 1)


def peak_rss_mb() -> float:
    """This process's peak resident set so far (the capture runs in it), MB."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


async def run(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    redis = RedisServer(directory / "redis", persist=False).start()
    postgres = PostgresServer({"wal_level": "logical"}).start()
    bucket = ChangeBucket(connect(redis.url), "bench", RESOURCES)
    try:
        url = postgres.url()
        conn = database.connect(url)
        database.query(conn, TABLE)
        capture = parse_capture({"capture": {"postgres": url, "tables": {
            "vms": {"resource": "vm", "id": "uuid",
                    "subResources": {"nic": ["nics"], "alias": ["alias"], "state": ["seq"]}}}}},
            {"vm": ["nic", "alias", "state"]}, "bench", directory)
        assert capture is not None
        install(conn, capture)
        conn.close()
        def start() -> CaptureRunner:
            runner = CaptureRunner(bucket, capture, {r.resource: r for r in RESOURCES}, url,
                                   "bench")
            runner.start()
            return runner

        await bucket.redis.config_set("slowlog-log-slower-than", 1000)  # µs
        await bucket.redis.config_set("slowlog-max-len", 128)
        first = start()  # the slot and its copy
        while first.stats.copies == 0:  # noqa: ASYNC110 - the stats are polled
            await asyncio.sleep(0.01)
        await first.stop()
        out: dict[str, Any] = await latency(url, bucket, start, args.latency)
        out |= {
            "rows_per_s_txn_1": round(await streamed(url, start, args.rows, 1)),
            "rows_per_s_txn_1000": round(await streamed(url, start, args.rows, 1000)),
            "cpu_us_per_row_txn_1": CPU[1], "cpu_us_per_row_txn_1000": CPU[1000],
            "longest_redis_call_ms_streaming": await longest_call(bucket),
            "peak_rss_mb_streaming": peak_rss_mb(),
        }
        if args.huge:  # before the calls below build large batches in this process
            out[f"seconds_txn_{args.huge}"] = round(
                args.huge / await streamed(url, start, args.huge, args.huge), 2)
            out[f"longest_redis_call_ms_txn_{args.huge}"] = await longest_call(bucket)
            out[f"peak_rss_mb_txn_{args.huge}"] = peak_rss_mb()
        out |= {
            "commit_many_rows_per_s": round(await commit_many_rate(bucket, args.rows)),
            "one_call_ms_1000": round(await one_call(bucket, 1000) * 1000, 1),
            f"one_call_ms_{args.big}": round(await one_call(bucket, args.big) * 1000, 1),
        }
        out["txn_1000_vs_commit_many"] = round(
            out["rows_per_s_txn_1000"] / out["commit_many_rows_per_s"], 3)
        return out
    finally:
        await bucket.aclose()
        postgres.remove()
        redis.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--big", type=int, default=100000)
    parser.add_argument("--latency", type=int, default=300, help="1-row transactions timed")
    parser.add_argument("--huge", type=int, default=0,
                        help="also stream one transaction of this many rows, end to end")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        print(json.dumps(asyncio.run(run(args, Path(directory))), indent=2))


if __name__ == "__main__":
    main()
