"""The processes under test, each a real subprocess pinned to its cores, started by the testing
kit's spawner (changefeed_testing.process): a private redis-server, the publisher (`changefeed
serve`), and the baseline servers of `bench.broadcast` and `bench.pages`. Also what /proc says
about a process: CPU seconds and resident memory.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import loops
from changefeed.protocol import Resource
from changefeed_testing import servers as kit
from changefeed_testing.process import ServerProcess

_TICKS = os.sysconf("SC_CLK_TCK")

MAX_CONNECTIONS = 100_000
"""server.maxConnections and maxConnectionsPerClient of the benchmarks' publishers."""
SUB_KINDS = tuple(f"k{n:02d}" for n in range(100))
"""P6's 100 change kinds: sub-resources of `vm` (names as long as `nic`, so items stay 150 B)."""
RESOURCE = Resource("vm", ("nic", "alias", "state", *SUB_KINDS), "/vms")
"""The one resource of the benchmarks' config."""


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of process `pid` (all its threads) and of its running
    children (the workers of `serve --workers N`) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / _TICKS
    return own + sum(cpu_seconds(child) for child in _children(pid))


def wait_seconds(pid: int) -> float:
    """Seconds the threads of process `pid` (and of its running children) have spent runnable
    but waiting for a core (/proc/PID/task/TID/schedstat): what a starved process shows."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, IndexError, ValueError):
                total += int((task / "schedstat").read_text().split()[1])
    except OSError:
        pass  # gone meanwhile
    return total / 1e9 + sum(wait_seconds(child) for child in _children(pid))


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass  # gone meanwhile, or no children file (an old kernel)
    return found


def rss_bytes(pid: int) -> int:
    """Resident memory of process `pid`."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` and of its running children (`serve --workers N`)."""
    return rss_bytes(pid) + sum(tree_rss_bytes(child) for child in _children(pid))


@dataclass(frozen=True)
class Cores:
    """Where things run: the server under test alone on `server`, load generators on `load`."""

    server: frozenset[int]
    load: frozenset[int]

    @classmethod
    def detect(cls) -> Cores:
        available = sorted(os.sched_getaffinity(0))
        if len(available) < 2:
            return cls(frozenset(available), frozenset(available))
        return cls(frozenset(available[:1]), frozenset(available[1:]))

    @property
    def all(self) -> frozenset[int]:
        return self.server | self.load


@contextlib.contextmanager
def pinned(cores: frozenset[int]) -> Iterator[None]:
    """Run this process (the driver) on `cores` for the duration."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


class Server(ServerProcess):
    """The testing kit's `ServerProcess`, with what /proc says about it."""

    def __enter__(self) -> Server:
        self.start()
        return self

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def rss(self) -> int:
        """Resident memory of the process and its children (a publisher's workers)."""
        return tree_rss_bytes(self.pid)


def redis_server(directory: Path, cores: frozenset[int] | None) -> Server:
    """A private redis-server on a unix socket, no persistence (the same for every side)."""
    directory.mkdir(parents=True, exist_ok=True)
    argv = [
        kit.redis_binary(), "--port", "0", "--unixsocket", str(directory / "redis.sock"),
        "--unixsocketperm", "700", "--dir", str(directory), "--save", "", "--appendonly", "no",
        "--logfile", "",
    ]
    return Server("redis-server", argv, directory / "redis.log", r"(?i)ready to accept", cores)


def redis_url(directory: Path) -> str:
    return f"unix://{directory / 'redis.sock'}"


def write_config(
    path: Path, url: str, server: dict[str, Any] | None = None, *,
    sections: dict[str, Any] | None = None, **limits: Any,
) -> Path:
    """A config.js for the benchmarks: bucket `bench`, resource `vm` with nic/alias/state and
    P6's k00..k99, `limits` (and `server` settings over the defaults) when given, and other
    top-level `sections` (e.g. `trace`)."""
    extra: dict[str, Any] = {
        "bucket": {"redisUrl": url, "name": "bench"}, "resources": [RESOURCE.to_wire()],
        # Every benchmark client connects from loopback: no per-client cap below the total,
        # which the publisher lowers to fit its open-file limit.
        "server": {"host": "127.0.0.1", "port": 0, "maxConnections": MAX_CONNECTIONS,
                   "maxConnectionsPerClient": MAX_CONNECTIONS},
        **(sections or {}),
    }
    if limits:
        extra["limits"] = limits
    if server:
        extra["server"] = {**extra["server"], **server}
    return kit.write_config(path, url, **extra)


def publisher(
    config: Path, log: Path, cores: frozenset[int] | None, *, loop: str | None = None,
    source: Path | None = None, workers: int = 1,
) -> Server:
    """`changefeed serve` (with `--loop loop` when given; from another source tree with
    `source`; `--workers` when more than 1)."""
    argv = [sys.executable, "-m", "changefeed_cli", "serve", "--config", str(config)]
    if loop:
        argv += ["--loop", loop]
    if workers > 1:
        argv += ["--workers", str(workers)]
    return Server("publisher", argv, log, kit.PublisherProcess._LISTENING, cores,
                  _env(source))


def _env(source: Path | None = None) -> dict[str, str]:
    """The environment of a child: this repository (or `source` before it) on PYTHONPATH."""
    env = dict(os.environ)
    paths = [str(source)] if source else []
    paths.append(str(Path(__file__).resolve().parent.parent))
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def publisher_url(server: Server) -> str:
    assert server.match is not None
    return server.match.group(1) or server.match.group(2)


def publisher_loop(server: Server) -> str:
    """The event loop the publisher says it runs on ("asyncio" when it does not say)."""
    found = re.search(r'"loop": ?"(\w+)"', server.log.read_text(errors="replace"))
    return found.group(1) if found else "asyncio"


def python_module(
    name: str, module: str, args: list[str], log: Path, cores: frozenset[int] | None,
    loop: str | None,
) -> Server:
    """A baseline server module of this package on the publisher's event loop (`loops.choose`);
    ready when it prints `listening port=N loop=L` (see `baseline_port`, `baseline_loop`)."""
    argv = [sys.executable, "-m", module, *args, "--loop", loops.choose(loop)]
    return Server(name, argv, log, r"listening port=(\d+) loop=(\w+)", cores, _env())


def baseline_port(server: Server) -> int:
    assert server.match is not None
    return int(server.match.group(1))


def baseline_loop(server: Server) -> str:
    assert server.match is not None
    return server.match.group(2)
