"""faults/busy.py: the spinning processes of `--busy`, started and always killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faults.busy import busy


def cpu_seconds(pid: int) -> float:
    """A process's user and system CPU time so far (Linux's /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spinning(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, ended but not reaped yet, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


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


def test_no_spinner_outlives_a_run_killed_outright() -> None:
    """A nemesis SIGKILLed (no finally runs) leaves no process spinning on the machine."""
    run = subprocess.Popen(
        [sys.executable, "-c", "import time\nfrom faults.busy import busy\n"
         "with busy(1) as s:\n    print(s[0].pid, flush=True)\n    time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    assert run.stdout is not None
    spinner = int(run.stdout.readline())
    assert spinning(spinner)
    run.send_signal(signal.SIGKILL)
    run.wait()
    for _ in range(100):
        if not spinning(spinner):
            return
        time.sleep(0.05)
    os.kill(spinner, signal.SIGKILL)
    raise AssertionError("the spinner outlived its killed parent")
