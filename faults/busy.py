"""A machine kept busy: one process spinning on each of `n` cores for as long as a fault run
lasts, so that the system under test waits for a core (the windows between two reads, or a
read and a write, widen). `python -m faults.nemesis --busy N`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

SPIN = "import os, sys\nparent = int(sys.argv[1])\nwhile os.getppid() == parent:\n    pass\n"
"""A busy loop that ends when its parent (argv[1], given: the loop may start after the parent
died) does, however it ends (even SIGKILLed: an orphan is given another parent)."""


@contextmanager
def busy(n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`n` busy-loop processes (none for 0), killed when the block ends, however it ends; a
    run killed outright leaves none spinning (each ends once its parent is gone)."""
    spinners: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(n):
            spinners.append(subprocess.Popen([sys.executable, "-c", SPIN, str(os.getpid())],
                                             stdin=subprocess.DEVNULL))
        yield spinners
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


__all__ = ["busy"]
