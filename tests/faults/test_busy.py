"""faults/busy.py: the spinning processes of `--busy`, started and always killed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from faults.busy import busy


def cpu_seconds(pid: int) -> float:
    """A process's user and system CPU time so far (Linux's /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_each_spinner_burns_cpu_until_the_block_ends() -> None:
    with busy(2) as spinners:
        assert len(spinners) == 2
        time.sleep(0.3)  # started
        before = [cpu_seconds(s.pid) for s in spinners]
        time.sleep(1.0)
        used = [cpu_seconds(s.pid) - b for s, b in zip(spinners, before, strict=True)]
        assert all(u > 0.1 for u in used), f"each one spins: {used} s of CPU in 1 s"
    assert all(s.returncode is not None for s in spinners)


def test_the_spinners_are_killed_when_the_run_fails() -> None:
    with pytest.raises(RuntimeError), busy(1) as spinners:
        raise RuntimeError("the run failed")
    assert spinners[0].returncode is not None


def test_none_for_zero() -> None:
    with busy(0) as spinners:
        assert spinners == []
