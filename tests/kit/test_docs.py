"""docs/testing.md's example, run as a listener author runs it: copied into an empty directory
(no conftest.py, no project settings) and tested with pytest, the fixtures coming from the
installed plugin through its `pytest11` entry point."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

from changefeed_testing import scaled

DOC = Path(__file__).parents[2] / "docs" / "testing.md"


def example(name: str) -> str:
    match = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```", DOC.read_text(), re.S)
    assert match, f"docs/testing.md lost its {name} example"
    return match.group(1)


async def test_the_documented_example_passes_in_a_project_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "test_vmnames.py").write_text(example("vmnames"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_vmnames.py",
        cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), scaled(120))
    text = output.decode()
    assert process.returncode == 0, text
    assert re.search(r"\b4 passed\b", text), text
