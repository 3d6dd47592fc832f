"""What the built wheel carries: the three packages with their py.typed markers, the license."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import version
from pathlib import Path

import changefeed
import listener
import publisher
from tests.servers import scaled

ROOT = Path(__file__).parents[2]
PACKAGES = ("changefeed", "listener", "publisher")


def test_the_wheel_ships_py_typed_and_the_license(tmp_path: Path) -> None:
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".*", "build", "*.egg-info", "__pycache__", "bench", "docs", "tests", "deploy",
        "spark-warehouse", "metastore_db",
    ))
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path),
         str(source)],
        capture_output=True, text=True, timeout=scaled(180),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = tmp_path.glob("changefeed-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "changefeed_cli.py" in names, "the command's module"
    for package in PACKAGES:
        assert f"{package}/__init__.py" in names and f"{package}/py.typed" in names, package
    licenses = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
    assert len(licenses) == 1, sorted(names)
    assert zipfile.ZipFile(wheel).read(licenses[0]) == (ROOT / "LICENSE").read_bytes()


def test_license_changelog_and_version_agree() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "MPL-2.0"}
    assert (ROOT / "LICENSE").read_text().startswith("Mozilla Public License Version 2.0\n")
    assert version("changefeed") == project["version"], "reinstall: pip install -e ."
    assert changefeed.__version__ == publisher.__version__ == listener.__version__ == version(
        "changefeed"
    )
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"\n## {project['version']}\n" in changelog
