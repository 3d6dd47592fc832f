"""P8: Spark rows -> published changes per second, through `bench/spark_bench.py` (the Spark
issue's benchmark, unchanged) in a process of its own on every core (Spark's local[2]).

It writes one cached DataFrame three times into a private Redis: the noop sink, the baseline
(foreachPartition + a redis-py pipeline of HSET, ZADD, XADD) and `format("changefeed")`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import orjson

from bench.scenario import Check, Context, Figure, Result

SCRIPT = Path(__file__).resolve().parent / "spark_bench.py"


class SparkRun:
    """spark_bench.py started in the background (quick mode runs it beside other scenarios)."""

    def __init__(self, ctx: Context) -> None:
        self.out = ctx.work / "spark_bench.json"
        self.log = ctx.work / "spark_bench.log"
        argv = [sys.executable, str(SCRIPT), "--json", str(self.out)]
        argv += ["--quick"] if ctx.quick else ["--rows", "300000", "--rounds", "3"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(SCRIPT.parent.parent), *filter(None, [os.environ.get("PYTHONPATH")])]))
        cores = ctx.cores.all
        self.command = " ".join(argv[1:])
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                preexec_fn=lambda: os.sched_setaffinity(0, cores),
            )

    async def result(self) -> Result:
        await asyncio.to_thread(self.process.wait)
        result = Result("P8", "Spark rows -> changes/s")
        if self.process.returncode != 0:
            tail = self.log.read_text(errors="replace")[-1500:]
            raise RuntimeError(f"spark_bench.py failed ({self.process.returncode}):\n{tail}")
        data = orjson.loads(self.out.read_bytes())
        runs = {r["name"]: r["rows_per_second"] for r in data["results"]}
        result.details = {"rows": data["rows"], "master": data["master"],
                          "rows_per_second": runs, "command": f"python {self.command}",
                          "ratio_per_round": data.get("ratio_per_round", [])}
        spread = data.get("ratio_per_round", [])
        if len(spread) > 1:
            result.notes.append(
                f"Medians of {len(spread)} rounds; changefeed / baseline per round: "
                + ", ".join(f"{r:.2f}x" for r in spread) + ".")
        result.checks.append(Check(
            "rows/s", Figure('df.write.format("changefeed")', runs["changefeed"], "rows/s"),
            Figure("foreachPartition + redis-py pipeline (HSET, ZADD, XADD)",
                   runs["baseline"], "rows/s"),
            ">= 2.5x", runs["changefeed"] >= 2.5 * runs["baseline"],
        ))
        result.checks.append(Check(
            "rows/s", Figure('df.write.format("changefeed")', runs["changefeed"], "rows/s"),
            Figure("noop sink (the cost of producing the rows)", runs["noop"], "rows/s"),
            "(information)", None,
        ))
        return result

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


async def spark_rows(ctx: Context) -> Result:
    run = SparkRun(ctx)
    try:
        return await run.result()
    finally:
        run.kill()
