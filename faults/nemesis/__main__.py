"""`python -m faults.nemesis --seed S --duration SECONDS`: seeded nemesis runs.

    python -m faults.nemesis --seed 7 --duration 60          # one run, its verdict
    python -m faults.nemesis --seed 7 --duration 1800 --soak # churn + leak slopes; faults
                                                                   # in the second half only
    python -m faults.nemesis --seed 7 --duration 1800 --soak --no-faults  # churn only
    python -m faults.nemesis --seed 1 --seed 2 --duration 300 --docs
                                                 # the runs docs/reliability.md shows
    python -m faults.nemesis --seed 12 --duration 1800 --soak --docs   # and its soak
    python -m faults.nemesis --seed 7 --duration 120 --spark  # with Spark writers too
    python -m faults.nemesis --seed 12 --duration 1800 --soak --busy 2 --docs
                                                 # its soak on a machine kept busy

The schedule is printed first: the same seed replays the same faults at the same times.
Exit status 1 when the oracle finds a problem (the seed, the fault in progress and the first
offending change with its trace are printed). Each run writes its whole history (every commit
attempt, fault and delivery, one JSON object per line: faults/nemesis/evidence.py) to
`history.jsonl` in its directory. `--keep DIR` keeps that and every server's files and logs
(publisher*.log, sentinel*.log, the AOFs, each node's final INFO) as the run's evidence.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import sys
import tempfile
from pathlib import Path

import structlog

from faults.__main__ import ROOT, commit, machine
from faults.busy import busy
from faults.nemesis.report import render, splice
from faults.nemesis.run import Result, nemesis
from faults.nemesis.schedule import make_schedule


async def runs(seeds: list[int], duration: float, soak: bool, directory: Path, *,
               calm: bool = False, spark: bool = False) -> list[Result]:
    results = []
    for seed in seeds:
        # A soak runs without faults for its first half, then with the seed's faults.
        faults = make_schedule(seed, duration, warmup=duration / 2) if soak else None
        if calm:
            faults = []
        result = await nemesis(seed, duration, directory / f"seed{seed}", faults=faults,
                               soak=soak, spark=spark)
        print(result.summary(), flush=True)
        for slope in result.slopes:
            print(f"  {slope.describe()}")
        if result.judgement.problems():
            print(result.judgement.trace, flush=True)
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faults.nemesis", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, action="append", help="repeatable; default 1")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of each run")
    parser.add_argument("--soak", action="store_true", help="churn and resource slopes")
    parser.add_argument("--no-faults", dest="calm", action="store_true",
                        help="no faults at all (a soak of churn only)")
    parser.add_argument("--docs", action="store_true",
                        help="rewrite the nemesis section of docs/reliability.md: the part "
                        "of this run's kind (runs, or soaks with --soak); the other is kept")
    parser.add_argument("--spark", action="store_true",
                        help="Spark writers too (a batch job per change, and a streaming query "
                             "of a micro-batch per change; replicas=1; costs a core)")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="keep N cores busy (a spinning process on each) while it runs: "
                             "the system under test waits for a core, its windows widen")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the servers' files and logs in this directory")
    args = parser.parse_args(argv)
    seeds = args.seed or [1]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    with busy(args.busy), tempfile.TemporaryDirectory(prefix="nemesis-") as scratch:
        directory = scratch if args.keep is None else args.keep
        Path(directory).mkdir(parents=True, exist_ok=True)
        results = asyncio.run(runs(seeds, args.duration, args.soak, Path(directory),
                                   calm=args.calm, spark=args.spark))
    if args.docs:
        path = ROOT / "docs" / "reliability.md"
        command = "python -m faults.nemesis " + " ".join(sys.argv[1:])
        document = path.read_text()
        section = render(results, command=command.strip(), machine=machine(), commit=commit(),
                         date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                         document=document, busy=args.busy)
        path.write_text(splice(document, section))
        print(f"wrote the nemesis section of {path}")
    return 1 if any(r.judgement.problems() for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
