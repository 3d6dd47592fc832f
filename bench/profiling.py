"""Where a process spends its time: py-spy samples it from outside (nothing changes in the
process under test), and the summary lists the functions that take the most samples."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any


class Recording:
    """py-spy recording `pid` for `seconds` into `out` (collapsed stacks), in the background."""

    def __init__(self, pid: int, seconds: float, out: Path) -> None:
        self.out = out
        self.process: subprocess.Popen[bytes] | None = None
        beside = Path(sys.executable).parent / "py-spy"
        binary = str(beside) if beside.exists() else shutil.which("py-spy")
        if binary is None:
            self.missing = "py-spy not installed (pip install -e '.[bench]')"
            return
        self.missing = ""
        out.parent.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [binary, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
             "--rate", "200", "--format", "raw", "--output", str(out), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )

    def summary(self) -> dict[str, Any]:
        if self.process is None:
            return {"error": self.missing}
        try:
            _, err = self.process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return {"error": "py-spy did not finish"}
        if not self.out.exists():
            return {"error": err.decode(errors="replace")[-500:]}
        return summarize(self.out.read_text()) | {"raw": str(self.out)}


def _name(frame: str) -> str:
    """`function (path/to/module.py:123)` -> `module.py:function`."""
    function, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{Path(path).name}:{function}" if path else function


def summarize(collapsed: str, top: int = 12) -> dict[str, Any]:
    """Self and inclusive shares of the samples, by function, from py-spy's raw format."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_name(f) for f in stack.split(";") if f and not f.startswith("process ")
                  and not f.startswith("thread ")]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    def share(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(name, round(100 * n / total, 1)) for name, n in counter.most_common(top)]
    return {"samples": total, "self_percent": share(own), "inclusive_percent": share(inclusive)}
