"""A server subprocess that writes its output to a log file, ready once a line of it matches.

The spawner of the benchmarks (bench/servers.py) and of anything whose output must not pass
through the process that started it (a drain thread there would take CPU from a measurement):
the child writes straight into its log, which `start` reads until the ready line appears (or
the child exits, or the scaled timeout passes: RuntimeError with the log's tail).

    with ServerProcess("redis-server", argv, work / "redis.log", r"(?i)ready to accept") as s:
        ...  # s.pid, s.match (the ready line's match), s.log
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from changefeed_testing.servers import scaled, terminate

READY_TIMEOUT = 60.0


class ServerProcess:
    """`argv` in a session of its own, started in its log's folder (`python -m` puts the working
    directory first on sys.path: a test's checkout must not shadow the code under test), pinned
    to `cores` before it runs (so every thread it starts is pinned), with `env` when given."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log: Path,
        ready: str | re.Pattern[str],
        cores: frozenset[int] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.ready = re.compile(ready)
        self.cores = cores
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None
        self.match: re.Match[str] | None = None
        """The ready line's match, once started."""

    def start(self) -> ServerProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        cores = self.cores
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True, cwd=self.log.parent,
                preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
            )
        deadline = time.monotonic() + scaled(READY_TIMEOUT)
        while time.monotonic() < deadline:
            self.match = self.ready.search(self.log.read_text(errors="replace"))
            if self.match:
                return self
            if self.process.poll() is not None:
                break
            time.sleep(0.02)  # the child writes its log itself: nothing to wait on but the file
        self.stop()
        tail = self.log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{self.name} did not start ({' '.join(self.argv)}):\n{tail}")

    @property
    def pid(self) -> int:
        assert self.process is not None, "start() first"
        return self.process.pid

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after the scaled 15 s; returns once it is gone."""
        terminate(self.process, 15)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["READY_TIMEOUT", "ServerProcess"]
