"""The benchmark suite's smoke run: `python -m bench --quick` runs every scenario at tiny sizes.

It checks that each scenario runs and reports a figure and a baseline, never the timings (the
machine is shared; docs/benchmarks.md holds the measured figures).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.servers import scaled

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = [f"P{n}" for n in range(1, 10)]


@pytest.mark.timeout(scaled(240))
def test_quick_run_reports_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    published = ROOT / "docs" / "benchmarks.md"
    docs = published.read_bytes() if published.exists() else None
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=scaled(220), check=False,
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
    # A smoke run never rewrites the published figures.
    if docs is not None:
        assert published.read_bytes() == docs
