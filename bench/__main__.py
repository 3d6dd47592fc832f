"""python -m bench: run the benchmark scenarios and report each against its baseline.

    python -m bench                       # every scenario (about 20 minutes); rewrites the tables
                                          # of docs/benchmarks.md and bench/results.json
    python -m bench --only P1,P3          # some of them (merged into bench/results.json)
    python -m bench --quick --out x.json  # a smoke run of every scenario at tiny sizes (< 1 min):
                                          # checks that each runs; writes only x.json
    python -m bench --profile             # also py-spy the publisher under load
    python -m bench --loop asyncio --only P1 --out x.json   # the publisher on asyncio's loop
    python -m bench --workers 2 --only P1,P2 --out x.json   # serve --workers 2, on every core
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import structlog

from bench import report
from bench.bootstrap import bootstrap_rate
from bench.commits import commit_throughput
from bench.crowd import idle_crowd
from bench.fanout import fanout_by_kind, fanout_throughput
from bench.idle import idle_memory
from bench.latency import paused_listeners, receive_latency
from bench.machine import describe
from bench.scenario import Context, Result
from bench.servers import Cores, pinned
from bench.single import single_commits
from bench.spark_rows import SparkRun, spark_rows
from bench.trace_cost import trace_cost
from bench.versus_nats import versus_nats

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.json"
DOCS = ROOT / "docs" / "benchmarks.md"
IMAGES = ROOT / "docs" / "img"

SCENARIOS: dict[str, Callable[[Context], Awaitable[Result]]] = {
    "P1": fanout_throughput, "P1S": single_commits, "P1T": trace_cost, "P2": receive_latency,
    "P3": commit_throughput, "P4": bootstrap_rate, "P5": idle_memory, "P6": fanout_by_kind,
    "P7": paused_listeners, "P8": spark_rows, "P9": versus_nats, "P10": idle_crowd,
}
"""The scenarios by their labels (`--only`, docs/benchmarks.md), each a function named for what
it measures."""


def revision() -> str:
    """`git describe --always --dirty` of this repository ("unknown" outside a git checkout);
    $BENCH_REVISION when set (a run from a copy of the tree, which edits cannot disturb)."""
    if os.environ.get("BENCH_REVISION"):
        return os.environ["BENCH_REVISION"]
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() or "unknown"


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, a minute or two: checks each scenario runs, no timings")
    parser.add_argument("--only", help="comma-separated scenarios, e.g. P1,P3")
    parser.add_argument("--out", type=Path, help="the JSON results file")
    parser.add_argument("--profile", action="store_true", help="py-spy the publisher under load")
    parser.add_argument("--loop", choices=["auto", "uvloop", "asyncio"],
                        help="the publisher's event loop (changefeed serve --loop)")
    parser.add_argument("--workers", type=int, default=1,
                        help="changefeed serve --workers N (the publisher on every core)")
    parser.add_argument("--publisher-src", type=Path,
                        help="run the publisher from this source tree (a patched copy)")
    return parser.parse_args(argv)


async def _run(ctx: Context, chosen: list[str], ran: dict[str, dict[str, Any]]) -> None:
    spark = SparkRun(ctx) if ctx.quick and "P8" in chosen else None
    try:
        for key in chosen:
            began = time.monotonic()
            load = [round(x, 2) for x in os.getloadavg()]
            try:
                if key == "P8" and spark is not None:
                    result = await spark.result()
                else:
                    result = await SCENARIOS[key](ctx)
            except Exception as exc:  # a failed scenario is reported; the others still run
                result = Result(key, key, error=f"{type(exc).__name__}: {exc}\n"
                                + traceback.format_exc(limit=6))
            result.seconds = round(time.monotonic() - began, 1)
            ctx.results[key] = result
            data = result.to_json()
            data["load_at_start"] = load
            if ctx.charts is not None and not result.error:
                data["charts"] = report.charts(data, ctx.charts, DOCS.parent)
            ran[key] = data
            print("\n".join(report.lines(data)), flush=True)
    finally:
        if spark is not None:
            spark.kill()


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    chosen = [key.strip().upper() for key in args.only.split(",")] if args.only else list(SCENARIOS)
    unknown = [key for key in chosen if key not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    variant = args.loop is not None or args.publisher_src is not None or args.workers != 1
    writes_docs = not args.quick and not variant and args.out is None
    out = args.out or (RESULTS if writes_docs else Path(tempfile.mkdtemp()) / "bench.json")
    work = Path(tempfile.mkdtemp(prefix="bench-"))
    try:
        import matplotlib  # noqa: F401

        charts: Path | None = IMAGES if writes_docs else work / "img"
    except ImportError:
        charts = None
    ctx = Context(quick=args.quick, work=work, charts=charts, cores=Cores.detect(),
                  profile=args.profile, loop=args.loop, source=args.publisher_src,
                  publisher_workers=args.workers)
    command = "python -m bench " + shlex.join(argv if argv is not None else sys.argv[1:])
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = describe()
    at = revision()
    print(f"{command.strip()} at {at}\nmachine: {machine['cores']} cores, Python "
          f"{machine['python']}, {machine['redis']}; server core(s) "
          f"{sorted(ctx.cores.server)}, load core(s) "
          f"{sorted(ctx.cores.load)}; scratch {work}", flush=True)
    began = time.monotonic()
    ran: dict[str, dict[str, Any]] = {}
    with pinned(ctx.cores.load):
        asyncio.run(_run(ctx, chosen, ran))
    for data in ran.values():
        data["command"] = command.strip()
        data["revision"] = at
        data["measured"] = started
    run: dict[str, Any] = {
        "command": command.strip(), "started": started, "quick": args.quick,
        "seconds": round(time.monotonic() - began, 1), "machine": machine,
        "variant": {"loop": args.loop or "default", "publisher_src": str(args.publisher_src or ""),
                    "workers": args.workers},
        "publisher_loop": sorted(ctx.publisher_loops),
        "baseline_loop": sorted(ctx.baseline_loops),
        "revisions": [at],
        "charts": "written" if charts is not None else "skipped: matplotlib not installed",
        "scenarios": ran,
    }
    if writes_docs and args.only and out.exists():
        previous = orjson.loads(out.read_bytes())
        run["scenarios"] = {**previous.get("scenarios", {}), **ran}
        run["scenarios"] = {k: run["scenarios"][k] for k in SCENARIOS if k in run["scenarios"]}
        run["command"] = previous.get("command", "python -m bench") + f"; then {command.strip()}"
        run["revisions"] = sorted({*previous.get("revisions", []), at})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(run, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    print(f"\nresults: {out}")
    if writes_docs:
        report.write_docs(DOCS, run)
        print(f"tables: {DOCS}")
    failed = [key for key, data in ran.items() if data.get("error")]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
