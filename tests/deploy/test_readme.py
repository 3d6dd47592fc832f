"""The README's Python snippets, run as written against the README's own server.

The server is `changefeed serve` on a copy of the sample config.js (its embedded Redis, a free
port instead of 8080) in a temporary directory, which is also where the snippets run: the
README says to run them from the directory of config.js. The only change to a snippet is the
port in `127.0.0.1:8080`. A snippet that iterates a listener runs until it is stopped, by a
SIGINT (Ctrl-C) after which it must exit with status 0 and no traceback; every other snippet
must finish with status 0. Standard output holds only what the snippets print: the libraries
log through `logging`, and an application that configures nothing sees none of their debug and
info lines (docs/logging.md, "The client libraries").
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.servers import PublisherProcess, default_sigint, drain, free_port, scaled

ROOT = Path(__file__).parents[2]
SNIPPET = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
PRINTED_EVENT = re.compile(r"(Resync|BootstrapStart|BootstrapRecords|BootstrapDone|ChangeEvent)\(")
"""What the listener snippet's `print(event)` writes at the start of each line."""


def snippets() -> list[str]:
    found = SNIPPET.findall((ROOT / "README.md").read_text())
    assert found, "the README lost its Python snippets"
    return found


def wait_for_line(process: subprocess.Popen[bytes], lines: list[str], pattern: str) -> str:
    """The first line of the child's output matching `pattern` (a regular expression)."""
    deadline = time.monotonic() + scaled(20)
    while time.monotonic() < deadline:
        for line in list(lines):
            if re.search(pattern, line):
                return line
        if process.poll() is not None:
            break
        time.sleep(0.01)  # the child's output arrives on a reader thread
    raise AssertionError(f"no line matching {pattern!r}:\n{''.join(lines)}")


def test_the_readme_python_snippets_run_against_the_sample_server(tmp_path: Path) -> None:
    port = free_port()
    sample = (ROOT / "config.js").read_text()
    assert sample.count("port: 8080,") == 1
    (tmp_path / "config.js").write_text(sample.replace("port: 8080,", f"port: {port},"))
    scripts = []
    for n, snippet in enumerate(snippets()):
        script = tmp_path / f"snippet{n}.py"
        script.write_text(snippet.replace("127.0.0.1:8080", f"127.0.0.1:{port}"))
        scripts.append((script, "async for event in feed" in snippet))
    listeners = [script for script, listens in scripts if listens]
    others = [script for script, listens in scripts if not listens]
    assert listeners and others, "the README shows a listener and a commit"

    server = PublisherProcess(tmp_path / "config.js").start()
    running: list[tuple[subprocess.Popen[bytes], list[str]]] = []
    try:
        assert server.url == f"http://127.0.0.1:{port}"
        for n, script in enumerate(listeners):
            with (tmp_path / f"listener{n}.stderr").open("wb") as stderr:
                process = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path,
                                           stdout=subprocess.PIPE, stderr=stderr,
                                           preexec_fn=default_sigint)
            lines: list[str] = []
            drain(process, lines)
            running.append((process, lines))
            wait_for_line(process, lines, r"^BootstrapDone\(resource='vm'")
        cursors = []
        for script in others:
            result = subprocess.run([sys.executable, str(script)], cwd=tmp_path,
                                    capture_output=True, text=True, timeout=scaled(30))
            assert result.returncode == 0, f"{script.name}:\n{result.stdout}{result.stderr}"
            assert re.fullmatch(r"(\w+\.\w+\n)*", result.stdout), result.stdout
            cursors += re.findall(r"^\w+\.\w+$", result.stdout, re.M)
        assert cursors, "the commit snippet prints the cursor of its commit"
        for process, lines in running:
            for cursor in cursors:
                wait_for_line(process, lines, rf"^ChangeEvent\(.*cursor='{re.escape(cursor)}'")
            others_printed = [line for line in lines if not PRINTED_EVENT.match(line)]
            assert not others_printed, "".join(others_printed)
        for n, (process, lines) in enumerate(running):  # Ctrl-C ends a listener quietly
            process.send_signal(signal.SIGINT)
            assert process.wait(scaled(10)) == 0, "".join(lines)
            said = "".join(lines) + (tmp_path / f"listener{n}.stderr").read_text()
            assert "Traceback" not in said and "KeyboardInterrupt" not in said, said
    finally:
        for process, _ in running:
            process.kill()
            process.wait()
        server.stop()
        shutil.rmtree(tmp_path / ".changefeed", ignore_errors=True)
