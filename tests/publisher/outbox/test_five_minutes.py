"""docs/postgres.md's five minutes, run as written by bash in an empty directory, against a
private PostgreSQL (named by PGHOST, PGPORT and PGUSER, as the page says) and nothing else: the
publisher's embedded Redis, a port the first line finds free, the role the lines create.

The one change to the lines: each one that starts a command in the background (`... &`) sends
its output to a file and is followed by a wait for that command's readiness line in it
(`listening`, `registered`), as a user waits before typing the next line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from changefeed_testing.postgres import PostgresServer
from tests.servers import scaled

DOC = Path(__file__).parents[3] / "docs" / "postgres.md"
READY = {"changefeed serve": "listening", "changefeed snoop": "registered"}


def five_minutes() -> str:
    text = DOC.read_text()
    start = text.index("## Five minutes")
    match = re.search(r"```sh\n(.*?)```", text[start:], re.S)
    assert match, "docs/postgres.md lost its five minutes"
    return match.group(1)


def with_waits(script: str) -> str:
    """`script` with each background command's output in jobN.log and a wait for its line."""
    lines = []
    for n, line in enumerate(script.splitlines()):
        command = line.split("  #")[0].rstrip()
        if not command.endswith("&"):
            lines.append(line)
            continue
        ready = next(word for name, word in READY.items() if command.startswith(name))
        lines.append(f"{command[:-1].rstrip()} > job{n}.log 2>&1 &")
        lines.append(f"until grep -q {ready} job{n}.log; do kill -0 $! || exit 9; "
                     "sleep 0.02; done")
    return "\n".join(lines) + "\n"


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    yield server
    server.remove()


def test_the_five_minutes_run_as_written(postgres: PostgresServer, tmp_path: Path) -> None:
    script = five_minutes()
    assert "6379" not in script and "8080" not in script, "nothing may be assumed running"
    (tmp_path / "five.sh").write_text("set -e\n" + with_waits(script))
    env = {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(postgres.port),
           "PGUSER": "postgres",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("SVC_DATABASE_URL", None)
    process = subprocess.Popen(["bash", "five.sh"], cwd=tmp_path, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=scaled(90))
        assert process.returncode == 0, output
        lines = output.splitlines()
        cursor = next(line for line in lines if re.fullmatch(r"[a-z2-7]+\.[0-9a-z]+", line))
        # curl ends its output without a newline: the page is the first JSON value there.
        page, _ = json.JSONDecoder().raw_decode(output[output.index('{"items"'):])
        assert page["items"] == [{"uuid": "vm-1", "ram": 1024}]
        assert "backlog" in output and "relaying" in output, output
        heard = next(path for path in tmp_path.glob("job*.log") if "registered" in
                     path.read_text())
        assert "vm-1" in heard.read_text() and cursor in heard.read_text(), heard.read_text()
    finally:
        _stop_group(process.pid)


def _stop_group(pgid: int) -> None:
    """SIGTERM to what the script left running (the publisher stops its embedded Redis), and
    wait for them to be gone."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + scaled(20)
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.killpg(pgid, signal.SIGKILL)
