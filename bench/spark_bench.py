"""Rows to published changes per second: the changefeed sink against a hand-written baseline.

Three writes of the same cached DataFrame on local[2], in one run, each into an emptied private
redis-server (the publisher's embedded one: unix socket, append-only file fsynced every second):

    noop          Spark's noop sink: the cost of producing the rows at all
    baseline      foreachPartition + a redis-py pipeline of HSET, ZADD and XADD per row, 500 rows
                  a round trip: the same store and log writes, without atomicity or idempotence
    changefeed    df.write.format("changefeed") with the row as state

    python bench/spark_bench.py                  # 1,000,000 rows, 3 rounds
    python bench/spark_bench.py --rows 200000 --json bench/spark_bench.json
    python bench/spark_bench.py --quick          # a smoke run of 2,000 rows, 1 round

The machine is shared, and the baseline (Python-bound) suffers more from someone else's load
than the changefeed write (Redis-bound): the three writes take turns `--rounds` times and each
figure is the median of its rounds, with the spread of the per-round ratio beside it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import redis
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from publisher.bucket.redis.embedded import EmbeddedRedis
from publisher.spark import register

BUCKET = "bench"
PIPELINE_ROWS = 500


def rows(spark: SparkSession, count: int) -> DataFrame:
    frame = spark.range(count).select(
        F.format_string("vm-%08d", "id").alias("uuid"),
        (F.col("id") % 4096).cast("int").alias("ram"),
        F.lit("running").alias("state"),
        F.concat(F.lit("10.0."), (F.col("id") % 250).cast("string")).alias("ip"),
    )
    return frame.repartition(2).persist()


def noop(frame: DataFrame, url: str) -> None:
    frame.write.format("noop").mode("overwrite").save()


def baseline(frame: DataFrame, url: str) -> None:
    def write(partition: Iterator[Row]) -> None:
        client = redis.Redis.from_url(url)
        pipe = client.pipeline(transaction=False)
        state, index, log = f"{{{BUCKET}}}:state:vm", f"{{{BUCKET}}}:index:vm", f"{{{BUCKET}}}:log"
        for number, row in enumerate(partition, 1):
            pipe.hset(state, row.uuid, orjson.dumps(row.asDict()))
            pipe.zadd(index, {row.uuid: 0})
            pipe.xadd(log, {"r": "vm", "s": b'["nic"]', "i": row.uuid})
            if number % PIPELINE_ROWS == 0:
                pipe.execute()
        pipe.execute()
        client.close()

    frame.foreachPartition(write)


def changefeed(frame: DataFrame, url: str) -> None:
    (
        frame.write.format("changefeed").mode("append")
        .option("redisUrl", url).option("bucket", BUCKET)
        .option("resource", "vm").option("idColumn", "uuid").option("subResources", "nic")
        .option("state", "row")
        .save()
    )


def measure(
    name: str, run: Callable[[DataFrame, str], None], frame: DataFrame, count: int, url: str
) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    client.flushall()
    redis_cpu = _redis_cpu(client)
    started = time.perf_counter()
    run(frame, url)
    seconds = time.perf_counter() - started
    redis_cpu = _redis_cpu(client) - redis_cpu
    published = client.xlen(f"{{{BUCKET}}}:log")
    client.close()
    if name != "noop" and published != count:
        raise SystemExit(f"{name}: {published} items in the log, expected {count}")
    return {"name": name, "rows": count, "seconds": round(seconds, 3),
            "rows_per_second": round(count / seconds), "redis_cpu_seconds": round(redis_cpu, 3)}


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median duration among `runs` (rounds of one write)."""
    ordered = sorted(runs, key=lambda r: float(r["seconds"]))
    return dict(ordered[len(ordered) // 2])


def _redis_cpu(client: redis.Redis) -> float:
    """CPU seconds the Redis server used so far (user and system, main thread and others)."""
    info: dict[str, Any] = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="2,000 rows, 1 round: a smoke run")
    parser.add_argument("--rounds", type=int, default=3, help="times each write is measured")
    parser.add_argument("--json", type=Path, default=Path("bench/spark_bench.json"))
    args = parser.parse_args()
    count = 2_000 if args.quick else args.rows

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]").appName("changefeed-bench")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    server = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="bench-"))).start()
    try:
        frame = rows(spark, count)
        frame.count()  # cached: every write reads the same rows from memory
        runs = [("noop", noop), ("baseline", baseline), ("changefeed", changefeed)]
        for name, run in runs:  # warm up the Python workers of each path
            measure(name, run, rows(spark, 1000), 1000, server.url)
        rounds = [[measure(name, run, frame, count, server.url) for name, run in runs]
                  for _ in range(1 if args.quick else args.rounds)]
    finally:
        server.stop()
        spark.stop()

    results = [_median([r[i] for r in rounds]) for i in range(len(runs))]
    ratios = [r[2]["rows_per_second"] / r[1]["rows_per_second"] for r in rounds]
    base = next(r["rows_per_second"] for r in results if r["name"] == "baseline")
    print(f"\n{count:,} rows on local[2], medians of {len(rounds)} round(s)\n")
    print(f"{'write':<12}{'seconds':>10}{'rows/s':>12}{'vs baseline':>14}{'Redis CPU s':>13}")
    for result in results:
        result["vs_baseline"] = round(result["rows_per_second"] / base, 2)
        print(f"{result['name']:<12}{result['seconds']:>10.2f}{result['rows_per_second']:>12,}"
              f"{result['vs_baseline']:>13.2f}x{result['redis_cpu_seconds']:>13.2f}")
    print("changefeed / baseline per round: " + ", ".join(f"{r:.2f}x" for r in ratios))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_bytes(orjson.dumps(
        {"rows": count, "master": "local[2]", "results": results,
         "ratio_per_round": [round(r, 3) for r in ratios], "rounds": rounds},
        option=orjson.OPT_INDENT_2))
    print(f"\nwritten to {args.json}")


if __name__ == "__main__":
    main()
