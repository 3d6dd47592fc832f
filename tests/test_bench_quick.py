"""The benchmark suite's smoke run: `python -m bench --quick` runs every scenario at tiny sizes.

It checks that each scenario runs and reports a figure and a baseline, that throughput and latency
runs actually delivered items (a broken publisher fails here), never the timings (the machine is
shared; docs/benchmarks.md holds the measured figures). The tools the scenarios need must be on
PATH: a missing one fails the test by name, it is not skipped.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.servers import scaled

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted(["P1", "P1S", "P1T", *(f"P{n}" for n in range(2, 11))])
TOOLS = {"redis-benchmark": "P3", "nats-server": "P9", "java": "P8 (Spark)"}
THROUGHPUT = ("P1", "P6", "P9")
"""Scenarios whose first check is deliveries/s, publisher against a baseline."""


@pytest.mark.bench
@pytest.mark.timeout(scaled(360))
def test_quick_run_reports_every_scenario(tmp_path: Path) -> None:
    for tool, needed_by in TOOLS.items():
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not on PATH: the benchmarks need it for {needed_by}")
    out = tmp_path / "bench.json"
    published = ROOT / "docs" / "benchmarks.md"
    docs = published.read_bytes() if published.exists() else None
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=scaled(340), check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    run = orjson.loads(out.read_bytes())
    assert run["quick"] is True
    assert {"cores", "python", "redis"} <= run["machine"].keys()
    assert sorted(run["scenarios"]) == SCENARIOS
    for key, scenario in run["scenarios"].items():
        assert scenario["error"] is None, f"{key}: {scenario['error']}"
        for side in ("figure", "baseline"):
            assert isinstance(scenario[side]["value"], int | float), f"{key} {side}"
            assert scenario[side]["unit"], f"{key} {side}"
        assert scenario["command"].startswith("python -m bench --quick")
        assert scenario["revision"], key
    scenarios = run["scenarios"]
    for key in THROUGHPUT:
        for side in ("figure", "baseline"):
            assert scenarios[key][side]["value"] > 0, f"{key} {side}: nothing delivered"
    samples = {
        "P2 publisher": scenarios["P2"]["details"]["publisher"]["samples"],
        "P2 bare broadcast": scenarios["P2"]["details"]["bare broadcast"]["samples"],
        "P2 redis pubsub": scenarios["P2"]["details"]["redis pubsub"]["samples"],
        "P7 without pauses": scenarios["P7"]["details"]["without pauses"]["samples"],
        "P7 with pauses": scenarios["P7"]["details"]["with pauses"]["samples"],
        "P9 NATS": scenarios["P9"]["details"]["nats"]["latency"]["samples"],
        "P10": scenarios["P10"]["details"]["latency"]["samples"],
    }
    for side in ("publisher", "bare broadcast"):  # P1': every round of every size timed items
        for count in ("1", "20"):
            rounds = scenarios["P1S"]["details"][count][side]
            assert rounds and all(r["samples"] > 0 for r in rounds), (side, count)
    assert scenarios["P10"]["details"]["connected"] == scenarios["P10"]["details"]["listeners"]
    assert all(count > 0 for count in samples.values()), samples
    # A smoke run never rewrites the published figures.
    if docs is not None:
        assert published.read_bytes() == docs
