"""`python -m tests.faults.nemesis --seed S --duration SECONDS`: one seeded nemesis run.

    python -m tests.faults.nemesis --seed 7 --duration 60          # print the verdict
    python -m tests.faults.nemesis --seed 7 --duration 600 --soak  # with churn and leak slopes
    python -m tests.faults.nemesis --seed 7 --duration 300 --soak --docs  # rewrite the section

The schedule is printed first: the same seed replays the same faults at the same times.
Exit status 1 when the oracle finds a problem (the seed, the fault in progress and the first
offending change are printed).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
from pathlib import Path

import structlog

from tests.faults.nemesis.run import nemesis


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.nemesis", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of faults")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the servers' files (logs, AOFs) in this directory")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(nemesis(args.seed, args.duration, args.keep))
    else:
        with tempfile.TemporaryDirectory(prefix="nemesis-") as directory:
            result = asyncio.run(nemesis(args.seed, args.duration, Path(directory)))
    print(result.summary())
    if result.judgement.problems():
        print(result.judgement.trace)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
