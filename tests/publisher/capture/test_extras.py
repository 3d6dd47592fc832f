"""The PostgreSQL drivers are an extra (`changefeed[postgres]`): without them the publisher
still starts, and a config.js naming `outbox` or `capture` says which extra to install
(publisher.config.extras). Each test runs in a subprocess whose drivers are made unimportable
(a None entry in sys.modules, as for a package that is not installed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import write_config

SCRIPT = """
import sys
for name in {missing!r}:
    sys.modules[name] = None
from changefeed.errors import ConfigError
import publisher.server.service  # the publisher imports without the drivers
from publisher.config.settings import load_config
for path in {paths!r}:
    try:
        load_config(path)
    except ConfigError as exc:
        print("ConfigError", exc.key, exc.expected)
    else:
        print("loaded")
"""
OUTBOX = {"postgres": "postgresql://svc@db/svc"}
CAPTURE = {"postgres": "postgresql://svc@db/svc",
           "tables": {"public.vms": {"resource": "vm", "id": "uuid"}}}
SECTIONS: list[dict[str, object]] = [{"outbox": OUTBOX}, {"capture": CAPTURE}]


def run(tmp_path: Path, missing: list[str], configs: list[dict[str, object]]) -> list[str]:
    """What loading each config.js (its top-level sections `configs`) says, in a subprocess
    without the `missing` modules."""
    paths = [str(write_config(tmp_path / f"config{n}.js", "redis://127.0.0.1:1/0", **sections))
             for n, sections in enumerate(configs)]
    code = SCRIPT.format(missing=missing, paths=paths)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("missing", ["asyncpg", "psycopg2"])
def test_a_section_without_the_extra_names_it(tmp_path: Path, missing: str) -> None:
    assert run(tmp_path, [missing], SECTIONS) == [
        f"ConfigError {section} the 'postgres' extra installed: "
        f"pip install 'changefeed[postgres]' ({missing} is missing)"
        for section in ("outbox", "capture")
    ]


def test_without_the_drivers_a_plain_config_loads(tmp_path: Path) -> None:
    assert run(tmp_path, ["asyncpg", "psycopg2"], [{}]) == ["loaded"]


def test_with_the_extra_the_sections_load(tmp_path: Path) -> None:
    assert run(tmp_path, [], SECTIONS) == ["loaded", "loaded"]


def test_without_the_drivers_the_command_line_starts() -> None:
    code = ("import sys\nfor name in ('asyncpg', 'psycopg2'):\n    sys.modules[name] = None\n"
            "from changefeed_cli import main\nmain(['capture', '--help'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "install" in done.stdout and "status" in done.stdout
