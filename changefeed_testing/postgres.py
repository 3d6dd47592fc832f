"""A private PostgreSQL for tests: initdb into a temporary directory, `postgres` on a free TCP
port of loopback and a unix socket there, ready when it logs that it accepts connections.

Never the machine's shared cluster. PostgreSQL refuses to run as root: as root the server runs
as the `postgres` user (its directory handed to it). `settings` adds server settings (the
capture's tests ask for `wal_level = logical`). The binaries are found with `pg_config
--bindir`, else in Debian's versioned folders, else on PATH.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from changefeed_testing.servers import free_port, scaled, terminate, wait_for_line

READY = "database system is ready to accept connections"


def postgres_bindir() -> Path:
    """The folder of initdb and postgres (RuntimeError when PostgreSQL is not installed)."""
    config = shutil.which("pg_config")
    if config is not None:
        found = subprocess.run([config, "--bindir"], capture_output=True, text=True, check=False)
        folder = Path(found.stdout.strip())
        if (folder / "initdb").exists():
            return folder
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if versions:
        return Path(versions[0]).parent
    initdb = shutil.which("initdb")
    if initdb is not None:
        return Path(initdb).parent
    raise RuntimeError("PostgreSQL is not installed (no initdb): apt-get install postgresql")


class PostgresServer:
    """A private PostgreSQL cluster. `start()` runs initdb once, then the server; `kill()`
    SIGKILLs it (its whole process group: no shutdown checkpoint), `start()` again recovers it
    on the same port and data."""

    def __init__(self, settings: Mapping[str, str] | None = None) -> None:
        self.settings = dict(settings or {})
        """Server settings beyond ours (`-c name=value`), e.g. {"wal_level": "logical"}."""
        self.bindir = postgres_bindir()
        self.directory = Path(tempfile.mkdtemp(prefix="cf-pg-"))
        self.data = self.directory / "data"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.lines: list[str] = []
        self._user: str | None = None
        if os.geteuid() == 0:  # initdb and postgres refuse root
            self._user = "postgres"
            entry = pwd.getpwnam(self._user)
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=self.directory,
            user=self._user, group=self._user, extra_groups=[] if self._user else None,
            start_new_session=True,
        )

    def start(self) -> PostgresServer:
        if not self.data.exists():
            initdb = self._run(
                str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync",
            )
            output, _ = initdb.communicate(timeout=scaled(60))
            if initdb.returncode != 0:
                raise RuntimeError("initdb failed:\n" + output.decode(errors="replace"))
        self.lines = []
        self.process = self._run(
            str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
            "-k", str(self.directory), "-c", "listen_addresses=127.0.0.1",
            "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=200",
            "-c", "shared_buffers=32MB", "-c", "log_min_messages=warning",
            "-c", "logging_collector=off",
            *(arg for name, value in self.settings.items() for arg in ("-c", f"{name}={value}")),
        )
        if wait_for_line(self.process, self.lines, 30, lambda line: READY in line):
            return self
        self.stop()
        raise RuntimeError("postgres did not start:\n" + "".join(self.lines))

    def output(self) -> str:
        return "".join(self.lines)

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend (crash recovery at the next start)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM (smart shutdown... then killed after a while)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # fast shutdown: disconnect clients
        terminate(self.process, 10)
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def remove(self) -> None:
        """Stop the server and delete its directory."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
