"""The reference load balancers of deploy/ (nginx.conf, haproxy.cfg), run for real on loopback.

Each reference file is rendered into a temporary directory with as few changes as possible: the
two publisher addresses, the listen address, and the process settings that need root or system
directories (user, pid and log files). Every rewrite must match exactly once, so a change of the
reference file that the rendering no longer fits fails the tests instead of going unnoticed.
The balancer runs in the foreground as a child of the test, as the current user.
"""

from __future__ import annotations

import getpass
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from changefeed_testing.servers import terminate
from tests.servers import drain, free_port, scaled

DEPLOY = Path(__file__).parents[2] / "deploy"


def render(text: str, rewrites: list[tuple[str, str]]) -> str:
    """Apply each (pattern, replacement): every pattern must match exactly once."""
    for pattern, replacement in rewrites:
        text, count = re.subn(pattern, replacement.replace("\\", "\\\\"), text, flags=re.M)
        assert count == 1, f"{pattern!r} matched {count} times in the reference file"
    return text


def require(binary: str) -> str:
    """The path of `binary`; the test fails (never skips) when it is missing."""
    found = shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/usr/local/sbin")
    assert found, f"{binary} is not installed: `.ci/run` installs it (apt-get install {binary})"
    return found


@dataclass
class Balancer:
    """A balancer rendered from its deploy/ reference file, in front of `upstreams`."""

    name: str
    directory: Path
    upstreams: tuple[str, str]  # host:port of the two publishers
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def config(self) -> Path:
        return self.directory / ("nginx.conf" if self.name == "nginx" else "haproxy.cfg")

    def write(self) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.name == "nginx":
            self.config.write_text(self._nginx())
        else:
            self.config.write_text(self._haproxy())
        return self.config

    def _nginx(self) -> str:
        tmp = self.directory
        temp_paths = "".join(
            f"\n    {kind}_temp_path {tmp}/{kind}_temp;"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        return render((DEPLOY / "nginx.conf").read_text(), [
            (r"^user www-data;$", f"user {getpass.getuser()};"),
            (r"^worker_processes auto;$", "worker_processes 1;"),
            (r"^pid /run/nginx\.pid;$", f"pid {tmp}/nginx.pid;"),
            (r"^error_log /var/log/nginx/error\.log warn;$", f"error_log {tmp}/error.log info;"),
            (r"^http \{$", "http {" + temp_paths),
            (r"access_log /var/log/nginx/changefeed\.access\.log;",
             f"access_log {tmp}/access.log;"),
            (r"server publisher-1:8080 ", f"server {self.upstreams[0]} "),
            (r"server publisher-2:8080 ", f"server {self.upstreams[1]} "),
            (r"listen 8080;", f"listen 127.0.0.1:{self.port};"),
        ])

    def _haproxy(self) -> str:
        return render((DEPLOY / "haproxy.cfg").read_text(), [
            (r"^    log /dev/log local0$", "    log stdout format raw local0 info"),
            (r"^    user haproxy\n", ""),
            (r"^    group haproxy\n", ""),
            (r"^    maxconn 50000$", "    maxconn 1000"),
            (r"server publisher-1 publisher-1:8080$", f"server publisher-1 {self.upstreams[0]}"),
            (r"server publisher-2 publisher-2:8080$", f"server publisher-2 {self.upstreams[1]}"),
            (r"bind :8080$", f"bind 127.0.0.1:{self.port}"),
        ])

    def command(self, *, check: bool = False) -> list[str]:
        if self.name == "nginx":
            tmp = str(self.directory)
            run = ["-t"] if check else ["-g", "daemon off;"]
            return [require("nginx"), "-e", f"{tmp}/error.log", "-p", tmp, "-c", str(self.config),
                    *run]
        return [require("haproxy"), "-f", str(self.config), "-c" if check else "-db"]

    def check(self) -> str:
        """`nginx -t` / `haproxy -c` on the rendered file: its output, asserting success."""
        self.write()
        result = subprocess.run(self.command(check=True), capture_output=True, text=True,
                                timeout=scaled(30))
        output = result.stdout + result.stderr
        if self.name == "nginx":
            output += _read(self.directory / "error.log")
        assert result.returncode == 0, f"{self.name} rejects its reference config:\n{output}"
        return output

    def start(self) -> Balancer:
        """Start it and wait until `GET /changefeeds` answers 200 through it."""
        self.write()
        self.process = subprocess.Popen(self.command(), stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT)
        drain(self.process, self.lines)
        deadline = time.monotonic() + scaled(15)
        while not answers(f"{self.url}/changefeeds"):
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.output()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} never answered:\n{self.output()}")
            time.sleep(0.02)  # the balancer gives no readiness signal of its own: poll
        return self

    def output(self) -> str:
        text = "".join(self.lines)
        if self.name == "nginx":
            text += _read(self.directory / "error.log")
        return text

    def stop(self) -> None:
        terminate(self.process, 10)


def answers(url: str) -> bool:
    """Whether GET `url` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=scaled(2)) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
