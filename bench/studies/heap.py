"""Where a publisher's memory per idle listener goes: `tracemalloc` inside a real publisher.

    python -m bench.studies.heap --listeners 1000   # Python heap per listener, by file and line

It starts a private Redis and `changefeed serve`, starts tracemalloc in it (the allocating line),
takes a snapshot, opens the listeners from client processes (`bench.clients`), waits, takes
another, and prints the difference per listener grouped by the file that allocated it, then the
largest lines. P5 reads RSS; this says which code holds it.

`--child` is the publisher side: `changefeed serve` with a SIGUSR1 handler that starts tracemalloc
(at the first signal) and writes a snapshot to the path in CHANGEFEED_HEAP_SNAPSHOT.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import runpy
import signal
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from types import FrameType

from bench.clients import ClientPool, WorkerSpec, split
from bench.scenario import listeners
from bench.servers import (
    Server,
    _env,
    publisher_url,
    redis_server,
    redis_url,
    write_config,
)
from changefeed_testing.process import READY_TIMEOUT
from changefeed_testing.servers import PublisherProcess

FRAMES = 1
SNAPSHOT = "CHANGEFEED_HEAP_SNAPSHOT"


def _child(argv: list[str]) -> None:
    target = Path(os.environ[SNAPSHOT])

    def dump(signum: int, frame: FrameType | None) -> None:
        # Tracing starts at the first signal, once the publisher is up (tracing its start-up
        # too would take minutes): what the connections allocate after it is what is compared.
        if not tracemalloc.is_tracing():
            tracemalloc.start(FRAMES)
        snapshot = tracemalloc.take_snapshot()
        partial = target.with_suffix(".tmp")
        snapshot.dump(str(partial))
        partial.rename(target)

    signal.signal(signal.SIGUSR1, dump)
    sys.argv = ["changefeed", *argv]
    runpy.run_module("changefeed_cli", run_name="__main__")


def _snapshot(server: Server, path: Path) -> tracemalloc.Snapshot:
    path.unlink(missing_ok=True)
    os.kill(server.pid, signal.SIGUSR1)
    deadline = time.monotonic() + READY_TIMEOUT
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the publisher wrote no snapshot")
        time.sleep(0.05)
    return tracemalloc.Snapshot.load(str(path))


def _short(filename: str) -> str:
    for marker in ("site-packages/", "lib/python3.11/", "/wt-", "/work/"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
    return filename


async def measure(count: int, work: Path) -> dict[str, object]:
    with redis_server(work / "redis", None):
        url = redis_url(work / "redis")
        config = write_config(work / "config.js", url)
        env = {**_env(), SNAPSHOT: str(work / "heap.snapshot")}
        argv = [sys.executable, "-m", "bench.studies.heap", "--child", "serve", "--config",
                str(config)]
        with Server("publisher", argv, work / "publisher.log", PublisherProcess._LISTENING, None,
                    env) as server:
            port = int(publisher_url(server).rsplit(":", 1)[1].rstrip("/"))
            await asyncio.sleep(1.0)
            before = _snapshot(server, work / "heap.snapshot")
            specs = [WorkerSpec("ws", "127.0.0.1", port, share, interval=0.05)
                     for share in split(listeners(count), 2 if count > 100 else 1)]
            with ClientPool(specs) as pool:
                pool.ready()
                await asyncio.sleep(2.0)
                after = _snapshot(server, work / "heap.snapshot")
    by_file: Counter[str] = Counter()
    for stat in after.compare_to(before, "filename"):
        by_file[_short(stat.traceback[0].filename)] += stat.size_diff
    lines = [
        (f"{_short(s.traceback[0].filename)}:{s.traceback[0].lineno}", s.size_diff, s.count_diff)
        for s in after.compare_to(before, "lineno")[:40]
    ]
    total = sum(by_file.values())
    return {"listeners": count, "bytes_per_listener": total / count,
            "by_file": {k: v / count for k, v in by_file.most_common(20)},
            "top_lines": [(where, size / count, blocks / count) for where, size, blocks in lines]}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listeners", type=int, default=1000)
    args = parser.parse_args()
    found = asyncio.run(measure(args.listeners, Path(tempfile.mkdtemp(prefix="heap-"))))
    print(f"{found['bytes_per_listener']:,.0f} bytes of Python heap per listener "
          f"({found['listeners']:,} listeners)\n\nby file:")
    for name, size in found["by_file"].items():  # type: ignore[attr-defined]
        print(f"  {size:8,.0f}  {name}")
    print("\nlargest lines (bytes, blocks per listener):")
    for where, size, blocks in found["top_lines"]:  # type: ignore[attr-defined]
        print(f"  {size:8,.0f} {blocks:5.1f}  {where}")


if __name__ == "__main__":
    main()
