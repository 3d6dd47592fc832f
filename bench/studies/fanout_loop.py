"""The hub's fan-out loop alone, at a git revision and in the working tree, side by side:

    python -m bench.studies.fanout_loop --baseline 8c382f3
    python -m bench.studies.fanout_loop --baseline 8c382f3 --listeners 1000 --batch 10 --runs 9

A hub in one process, no Redis and no event loop: `--listeners` websocket subscribers of one
resource over transports that discard what they are written (always room, never closing), fed
`--entries` new entries one at a time (`--batch 1`, the tail's common case) or `--batch` at a
time. Each side runs in a subprocess of its own that imports `publisher` from its tree (the
baseline's exported with `git archive` into a temporary directory), the two interleaved
A B A B ... `--runs` times; each subprocess reports the median of its rounds' thread CPU time
per delivery (one entry written to one listener). It prints each side's median over the runs and
their spread (min-max), and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("changefeed", "publisher")
"""What a side imports from its tree."""


def measure(listeners: int, batch: int, entries: int, rounds: int) -> float:
    """In the subprocess: the median over `rounds` of ns of thread CPU per delivery."""
    from changefeed.cursor import ZERO, StreamId
    from changefeed.protocol import ChangeKind, Registration
    from publisher.bucket import LogEntry
    from publisher.delivery.hub import Hub, Subscriber
    from publisher.delivery.window import Window

    class Sink:
        def write(self, data: bytes) -> None:
            pass

        def get_write_buffer_size(self) -> int:
            return 0

        def is_closing(self) -> bool:
            return False

        def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
            pass

        def close(self) -> None:
            pass

        def abort(self) -> None:
            pass

    # No bucket: the order of one Redis (publisher.delivery.order.order_of).
    hub = Hub(Window(max(4 * batch, 64), ZERO), None, 1 << 20)  # type: ignore[arg-type]
    registration = Registration("i", "s", (ChangeKind("vm", ("nic",)),), 1)
    for number in range(listeners):
        hub.add(Subscriber(registration, Sink(), None, f"bench-{number}"))
    ms = 0

    def feed(count: int) -> None:
        nonlocal ms
        for _ in range(count // batch):
            chunk = [LogEntry(StreamId(ms + i + 1, 0), "vm", ("nic",), f"vm-{ms + i}")
                     for i in range(batch)]
            ms += batch
            hub.fan_out(chunk)

    feed(max(entries // 10, batch))  # warm
    per: list[float] = []
    for _ in range(rounds):
        started = time.thread_time_ns()
        feed(entries)
        per.append((time.thread_time_ns() - started) / (entries // batch * batch * listeners))
    return statistics.median(per)


def export(revision: str, into: Path) -> Path:
    """The trees of `revision` under `into` (`git archive`)."""
    archive = subprocess.run(["git", "archive", revision, *TREES], cwd=ROOT, check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def side(tree: Path, args: argparse.Namespace) -> float:
    """One subprocess importing `tree`'s publisher: its ns per delivery."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.studies.fanout_loop", "--child", str(tree),
         "--listeners", str(args.listeners), "--batch", str(args.batch),
         "--entries", str(args.entries), "--rounds", str(args.rounds)],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    result = json.loads(out.splitlines()[-1])
    if not result["imported"].startswith(str(tree)):
        raise SystemExit(f"{tree}: imported publisher from {result['imported']}")
    return float(result["ns"])


def compare(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="fanout-loop-") as tmp:
        base = export(args.baseline, Path(tmp))
        runs: dict[str, list[float]] = {args.baseline: [], "tree": []}
        for _ in range(args.runs):
            runs[args.baseline].append(side(base, args))
            runs["tree"].append(side(ROOT, args))
    load = os.getloadavg()
    print(f"fan-out loop: {args.listeners} listeners, batch {args.batch}, "
          f"{args.entries} entries x {args.rounds} rounds, {args.runs} interleaved runs; "
          f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    medians = {}
    for name, values in runs.items():
        medians[name] = statistics.median(values)
        print(f"  {name:>10}: {medians[name]:6.0f} ns per delivery "
              f"(spread {min(values):.0f}-{max(values):.0f})")
    print(f"  tree / {args.baseline}: {medians['tree'] / medians[args.baseline]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="8c382f3", help="git revision to compare with")
    parser.add_argument("--listeners", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=1, help="entries per fan-out call")
    parser.add_argument("--entries", type=int, default=200, help="entries per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per subprocess")
    parser.add_argument("--runs", type=int, default=5, help="subprocesses per side")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is None:
        compare(args)
        return
    sys.path.insert(0, args.child)  # ahead of the working directory `-m` puts first
    import publisher

    ns = measure(args.listeners, args.batch, args.entries, args.rounds)
    print(json.dumps({"ns": ns, "imported": str(Path(publisher.__file__).resolve())}))


if __name__ == "__main__":
    main()
