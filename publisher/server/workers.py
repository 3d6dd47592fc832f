"""`changefeed serve --workers N`: N publisher processes on one port, supervised.

The parent binds nothing and serves nothing. It starts N children, each a `changefeed serve`
of its own (its own tail, its own Redis pools, its own publisher id in the fleet), listening on
the same port with `SO_REUSEPORT`: the kernel spreads new connections across them. The parent

- restarts a worker that exits while the fleet runs, after a delay that grows while the worker
  keeps dying young (`Restarts`, pure); it gives up, stopping every worker, when a worker dies
  young `GIVE_UP` times in a row (a config or port problem that a restart does not fix);
- forwards SIGTERM/SIGINT (drain: each worker drains and closes its listeners with 1001) and
  SIGHUP (reload: each worker reads config.js again) to every worker, and exits once they all
  have, with 0 when they stopped on a signal;
- tells systemd READY once the workers are started, and pings its watchdog.

A worker follows its parent: started with `PARENT_ENV` naming the parent's pid, it watches its
parent pid (`os.getppid()`, twice a second) and sends itself SIGTERM when that changes (the
parent died, however: SIGKILL and OOM included, and the worker was adopted), so a SIGKILLed
parent leaves no worker serving on the port without a supervisor; the worker drains as on any
SIGTERM (`follow_parent`). Not `PR_SET_PDEATHSIG`: Linux sends that when the *thread* that
forked the worker exits, not the process, which a supervisor cannot promise of its forks.

The embedded Redis, when config.js names none, is started by the parent (`cli.serve`) and
handed to the workers as `CHANGEFEED_REDIS_URL`; port 0 is resolved by the parent to one free
port first, handed over as `CHANGEFEED_PORT`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from changefeed.backoff import Backoff
from changefeed.tasks import cancel_and_wait
from publisher.server.sdnotify import Notifier

log = structlog.get_logger(__name__)

YOUNG = 10.0
"""A worker that exits sooner than this after its start died young: the next restart waits."""
GIVE_UP = 5
"""Young deaths in a row after which the parent stops every worker and exits 1."""
RESTART = Backoff(initial=0.1, maximum=5.0, factor=2.0, jitter=0.2)
"""Delays before restarting a worker that keeps dying young."""


PARENT_ENV = "CHANGEFEED_WORKER_OF"
"""The environment variable that makes a `serve` a worker: the pid of its supervising parent."""
PARENT_CHECK = 0.5
"""Seconds between a worker's looks at its parent pid."""


def follow_parent(environ: Mapping[str, str] = os.environ, every: float = PARENT_CHECK) -> None:
    """In a worker: be sent SIGTERM when the supervising parent dies.

    If the parent died before this call, the worker was already adopted by another process: it
    exits at once. Otherwise a daemon thread looks at `os.getppid()` every `every` seconds and,
    once it is no longer the parent's, logs it and sends this process SIGTERM (the drain). A
    process started without `PARENT_ENV` (not a worker) is left alone."""
    value = environ.get(PARENT_ENV)
    if not value:
        return
    parent = int(value)
    if os.getppid() != parent:
        log.error("the supervising parent is gone: not starting", parent=parent)
        raise SystemExit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        log.error("the supervising parent is gone: draining", parent=parent)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="follow-parent", daemon=True).start()


@dataclass(slots=True)
class Restarts:
    """When to restart one worker slot, from how long its last runs lasted: pure, no clock."""

    backoff: Backoff = RESTART
    young: float = YOUNG
    give_up: int = GIVE_UP
    deaths: int = 0
    """Young deaths in a row."""
    _delays: list[float] = field(default_factory=list)

    def exited(self, lasted: float) -> float | None:
        """Seconds to wait before the restart of a worker that ran `lasted` seconds; None: give
        up (it died young `give_up` times in a row)."""
        if lasted >= self.young:
            self.deaths = 0
            return 0.0
        self.deaths += 1
        if self.deaths >= self.give_up:
            return None
        delay = self.backoff.initial
        for _ in range(self.deaths - 1):
            delay = min(delay * self.backoff.factor, self.backoff.maximum)
        return delay


def free_port(host: str) -> int:
    """A port free on `host` now, for N workers asked to listen on port 0."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class Workers:
    """Starts `count` copies of `command` (with `env`) and keeps them running until a signal."""

    def __init__(
        self,
        command: Sequence[str],
        count: int,
        env: Mapping[str, str],
        notifier: Notifier | None = None,
    ) -> None:
        self.command = list(command)
        self.count = count
        self.env = {**env, PARENT_ENV: str(os.getpid())}
        self.notifier = notifier or Notifier()
        self.processes: dict[int, asyncio.subprocess.Process] = {}
        """The running worker of each slot."""
        self.stopping = False
        self.failed = False
        self._changed = asyncio.Event()

    async def _spawn(self, slot: int) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(*self.command, env=self.env)
        self.processes[slot] = process
        log.info("worker started", worker=slot, pid=process.pid)
        return process

    def _signal_all(self, sig: signal.Signals) -> None:
        for process in self.processes.values():
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(sig)

    def _stop(self) -> None:
        if not self.stopping:
            log.info("stopping workers: draining", workers=len(self.processes))
            self.notifier.stopping("draining")
        self.stopping = True
        self._signal_all(signal.SIGTERM)
        self._changed.set()

    def _hangup(self) -> None:
        log.info("reloading workers", workers=len(self.processes))
        self._signal_all(signal.SIGHUP)

    async def _keep(self, slot: int) -> None:
        """Run slot `slot`'s worker, restarting it, until the fleet stops."""
        restarts = Restarts()
        while not self.stopping:
            process = await self._spawn(slot)
            started = time.monotonic()
            code = await process.wait()
            if self.stopping:
                break
            delay = restarts.exited(time.monotonic() - started)
            if delay is None:
                log.error("worker keeps dying young: stopping every worker", worker=slot,
                          exit_code=code, deaths=restarts.deaths)
                self.failed = True
                self._stop()
                break
            log.warning("worker exited: restarting it", worker=slot, pid=process.pid,
                        exit_code=code, delay=delay)
            if delay:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):  # wait_for could lose a cancel
                        await self._changed.wait()
        self.processes.pop(slot, None)

    async def run(self) -> int:
        """Run until SIGTERM/SIGINT and every worker's exit; the exit code of the parent."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop)
        loop.add_signal_handler(signal.SIGHUP, self._hangup)
        slots = [asyncio.create_task(self._keep(n), name=f"worker{n}") for n in range(self.count)]
        self.notifier.ready(f"{self.count} workers started")
        watchdog = asyncio.create_task(self.notifier.watchdog_forever(), name="watchdog")
        try:
            await asyncio.gather(*slots)
        finally:
            await cancel_and_wait(watchdog)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(sig)
        log.info("workers stopped", failed=self.failed)
        return 1 if self.failed else 0


__all__ = [
    "GIVE_UP", "PARENT_CHECK", "PARENT_ENV", "RESTART", "YOUNG", "Restarts", "Workers",
    "follow_parent", "free_port",
]
