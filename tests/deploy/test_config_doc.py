"""docs/config.md against the code: the override table and the duplicate-key error."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click

from publisher.cli.commands import publish, serve
from tests.servers import scaled

ROOT = Path(__file__).parents[2]
DOC = (ROOT / "docs" / "config.md").read_text()


def test_the_override_table_lists_each_flag_of_serve_and_publish_that_overrides_the_config(
) -> None:
    section = DOC[DOC.index("## Command-line overrides"):DOC.index("The overrides are validated")]
    rows = re.findall(r"^\| `(--[a-z-]+)[^`]*` \| ([^|]+) \| ([^|]+) \|$", section, re.M)
    documented = {flag: {c.strip(" `") for c in commands.split(",")} for flag, commands, _ in rows}
    overriding = {"--config", "--host", "--port", "--redis-url"}
    actual: dict[str, set[str]] = {}
    for command in (serve, publish):
        for param in command.params:
            if isinstance(param, click.Option) and param.opts[0] in overriding:
                actual.setdefault(param.opts[0], set()).add(str(command.name))
    assert documented == actual
    assert len(section.strip().splitlines()) == 2 + 2 + len(rows), "one row per flag, whole"


def test_a_duplicate_key_is_refused_as_the_page_says(tmp_path: Path) -> None:
    sample = (ROOT / "config.js").read_text()
    config = tmp_path / "config.js"
    config.write_text(sample.replace("maxAge: 3600,", "maxAge: 3600, maxAge: 60,", 1))
    result = subprocess.run(
        [sys.executable, "-m", "changefeed_cli", "serve", "--config", str(config)],
        capture_output=True, text=True, timeout=scaled(30),
    )
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    line = line.replace(str(config), "config.js")
    # The page's example is of a smaller file: the same message, but for its line and excerpt.
    shape = re.compile(r"Error: config\.js:\d+: got '[^']*', expected a JavaScript object "
                       r"literal \(Duplicate key \"maxAge\" found in object\)")
    assert shape.fullmatch(line), line
    assert any(shape.fullmatch(said) for said in DOC.splitlines()), "config.md lost the example"
    assert "not reported" not in DOC
