"""`python -m faults`: run the full fault matrix and write docs/reliability.md.

    python -m faults                     # every scenario, full size (a few minutes)
    python -m faults --quick             # the sizes the test suite uses
    python -m faults --only herd_of_resumes --only redis_sigstop --out /tmp/r.md
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import structlog

from faults.harness import FULL, QUICK, Row, Size
from faults.report import render
from faults.scenarios import SCENARIOS

ROOT = Path(__file__).parents[1]


async def run(names: list[str], size: Size, directory: Path) -> list[Row]:
    rows = []
    for name in names:
        started = time.monotonic()
        row = await SCENARIOS[name](size, directory / name)
        print(f"{row.summary()} [{time.monotonic() - started:.1f} s]", flush=True)
        rows.append(row)
    return rows


def machine() -> str:
    return f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs, " \
           f"{platform.system()} {platform.release()}, Python {platform.python_version()})"


def commit() -> str:
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True, check=False)
    return found.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the test suite's sizes")
    parser.add_argument("--only", action="append", choices=list(SCENARIOS), default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "reliability.md")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    names = args.only or list(SCENARIOS)
    size = QUICK if args.quick else FULL
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="faults-") as directory:
        rows = asyncio.run(run(names, size, Path(directory)))
    command = "python -m faults" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else "")
    from faults.nemesis.report import kept  # the nemesis section stays as it was

    nemesis = kept(args.out.read_text()) if args.out.exists() else ""
    args.out.write_text(render(
        rows, command=command, machine=machine(), commit=commit(),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        seconds=time.monotonic() - started,
    ) + ("\n" + nemesis if nemesis else ""))
    print(f"wrote {args.out}")
    return 1 if any(row.verdict.problems() for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
