"""Load-generator processes: many websocket (or NATS) subscribers per process, one epoll loop each.

A `ClientPool` starts a few worker processes, pinned to the load cores. Each opens its share of
the connections (websocket upgrade plus registration, or NATS CONNECT plus SUB), then reads every
socket from one `select.epoll` loop with no per-connection task, counting the change items (and,
in latency runs, the age of each from the stamp in its id: `bench.items`). The count is kept in
shared memory so the driver can watch it; histograms and CPU time come back over a pipe.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import resource
import select
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized
from typing import Any, Literal

from bench import items, wire
from bench.histogram import Histogram

BATCH = 100
IP_BIND_ADDRESS_NO_PORT = 24
"""Linux's socket option (not in Python's `socket` module)."""
"""Connections opened at a time: below the servers' listen backlogs."""
SETUP_TIMEOUT = 60.0
PATH = "/changefeeds"
HEADERS = {"Accept-Version": "~1"}
"""The websocket upgrade: the publisher's route, registrations in v1."""


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker process connects to and how it registers each connection."""

    kind: Literal["ws", "nats"]
    host: str
    port: int
    registrations: tuple[bytes, ...]
    """One per connection: the registration JSON (ws) or the subject (nats)."""
    latency: bool = False
    origin_ns: int = 0
    cores: frozenset[int] | None = None
    rcvbuf: int | None = None
    """SO_RCVBUF for every socket (small: a paused listener backs up the server sooner)."""
    source: str | None = None
    """Local address to connect from (127.0.0.x): each gives its own ephemeral ports, for more
    connections to one server port than one address has ports (P10)."""
    interval: float = 0.0
    """Seconds to sleep between two polls: 0 reads each socket as soon as data arrives (what
    the latency probes do); more lets items gather so each read takes several (bulk readers)."""


@dataclass(slots=True)
class _Conn:
    sock: socket.socket
    tail: bytes = b""


@dataclass
class PoolReport:
    frames: int
    histogram: Histogram
    cpu_seconds: float
    wall_seconds: float
    """The longest of the workers' measured intervals (mark to report)."""
    close_codes: dict[int, int]
    connections: int


def split(registrations: list[bytes], parts: int) -> list[tuple[bytes, ...]]:
    """`registrations` in `parts` nearly equal runs (none empty)."""
    parts = max(1, min(parts, len(registrations)))
    size, extra = divmod(len(registrations), parts)
    out, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        out.append(tuple(registrations[start:end]))
        start = end
    return out


def raise_file_limit() -> int:
    """Raise this process's open-file limit to its hard limit (which only a privileged process
    may raise); the limit now. Children started afterwards inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


class ClientPool:
    """Worker processes holding the connections; a context manager that stops them on exit."""

    def __init__(self, specs: list[WorkerSpec]) -> None:
        context = multiprocessing.get_context("spawn")
        self._paused: set[int] = set()
        self._workers: list[tuple[Any, Connection, Synchronized[int]]] = []
        for spec in specs:
            parent, child = context.Pipe()
            counter = context.Value("q", 0, lock=False)
            process = context.Process(target=run_worker, args=(spec, child, counter), daemon=True)
            process.start()
            child.close()
            self._workers.append((process, parent, counter))

    def __enter__(self) -> ClientPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ready(self, timeout: float = SETUP_TIMEOUT) -> int:
        """Wait until every worker has registered all its connections; their number."""
        total = 0
        deadline = time.monotonic() + timeout
        for process, pipe, _ in self._workers:
            if not pipe.poll(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"client worker {process.pid} not ready in {timeout:g} s")
            message = pipe.recv()
            if message[0] != "ready":
                raise RuntimeError(f"client worker {process.pid} failed: {message[1]}")
            total += message[1]
        return total

    def received(self) -> int:
        """Change items received so far by every connection of the pool."""
        return sum(counter.value for _, _, counter in self._workers)

    def mark(self) -> None:
        """Start the measured interval: histograms and CPU time count from here."""
        for _, pipe, _ in self._active():
            pipe.send(("mark",))

    def report(self, timeout: float = 30.0) -> PoolReport:
        """What every (not paused) worker saw since `mark`."""
        active = self._active()
        for _, pipe, _ in active:
            pipe.send(("report",))
        reports = []
        for process, pipe, _ in active:
            if not pipe.poll(timeout):
                raise RuntimeError(f"client worker {process.pid} did not report")
            reports.append(pipe.recv()[1])
        codes: dict[int, int] = {}
        for report in reports:
            for code, count in report["close_codes"].items():
                codes[int(code)] = codes.get(int(code), 0) + count
        return PoolReport(
            frames=sum(r["frames"] for r in reports),
            histogram=Histogram.merged(r["histogram"] for r in reports if r["histogram"]),
            cpu_seconds=sum(r["cpu"] for r in reports),
            wall_seconds=max((r["wall"] for r in reports), default=0.0),
            close_codes=codes,
            connections=sum(r["connections"] for r in reports),
        )

    def pause(self, index: int) -> None:
        """Stop worker `index` (SIGSTOP): its sockets are no longer read."""
        os.kill(self._workers[index][0].pid, signal.SIGSTOP)
        self._paused.add(index)

    def resume(self, index: int) -> None:
        os.kill(self._workers[index][0].pid, signal.SIGCONT)
        self._paused.discard(index)

    def _active(self) -> list[tuple[Any, Connection, Synchronized[int]]]:
        return [w for i, w in enumerate(self._workers) if i not in self._paused]

    def close(self) -> None:
        for index in list(self._paused):
            self.resume(index)
        for _, pipe, _ in self._workers:
            with contextlib.suppress(OSError):
                pipe.send(("stop",))
        for process, pipe, _ in self._workers:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()
            pipe.close()


# --- the worker process ------------------------------------------------------------------


def run_worker(spec: WorkerSpec, pipe: Connection, counter: Synchronized[int]) -> None:
    raise_file_limit()
    if spec.cores:
        os.sched_setaffinity(0, spec.cores)
    if spec.latency:
        # The probes time items as they arrive: they should not wait for the bulk readers.
        with contextlib.suppress(OSError):
            os.nice(-10)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        conns = list(_open_all(spec))
    except (OSError, RuntimeError, ValueError) as exc:
        pipe.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    pipe.send(("ready", len(conns)))
    _Loop(spec, conns, pipe, counter).run()


def _open_all(spec: WorkerSpec) -> Iterator[_Conn]:
    regs = spec.registrations
    for start in range(0, len(regs), BATCH):
        batch = regs[start : start + BATCH]
        socks = [_connect(spec) for _ in batch]
        if spec.kind == "ws":
            yield from _websockets(spec, socks, batch)
        else:
            yield from _nats(socks, batch)


def _connect(spec: WorkerSpec) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if spec.rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, spec.rcvbuf)
    sock.settimeout(SETUP_TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if spec.source:
        # The port is chosen at connect(), per destination, not reserved by bind().
        sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
        sock.bind((spec.source, 0))
    sock.connect((spec.host, spec.port))
    return sock


def _read_until(sock: socket.socket, buffer: bytes, marker: bytes) -> tuple[bytes, bytes]:
    """(bytes up to and including `marker`, the rest)."""
    while marker not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError(f"connection closed during setup after {buffer[:200]!r}")
        buffer += chunk
    at = buffer.index(marker) + len(marker)
    return buffer[:at], buffer[at:]


def _websockets(
    spec: WorkerSpec, socks: list[socket.socket], regs: tuple[bytes, ...]
) -> Iterator[_Conn]:
    for sock in socks:
        sock.sendall(wire.upgrade_request(spec.host, spec.port, PATH, HEADERS))
    rests = []
    for sock in socks:
        head, rest = _read_until(sock, b"", b"\r\n\r\n")
        if wire.upgrade_status(head) != 101:
            raise RuntimeError(f"websocket upgrade refused: {head[:300]!r}")
        rests.append(rest)
    for sock, reg in zip(socks, regs, strict=True):
        sock.sendall(wire.client_frame(wire.TEXT, reg))
    for sock, rest in zip(socks, rests, strict=True):
        buffer = rest
        while True:
            frames, _ = wire.ws_frames(buffer)
            if frames:
                opcode, start, end = frames[0]
                if opcode == wire.CLOSE:
                    code = wire.close_code(buffer, start, end)
                    reason = buffer[start + 2 : end]
                    raise RuntimeError(f"registration refused: {code} {reason!r}")
                # The registration reply; anything after it is the stream.
                yield _Conn(sock, buffer[end:])
                break
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError("connection closed before the registration reply")
            buffer += chunk


def _nats(socks: list[socket.socket], subjects: tuple[bytes, ...]) -> Iterator[_Conn]:
    for sock, subject in zip(socks, subjects, strict=True):
        _read_until(sock, b"", b"\r\n")  # INFO
        sock.sendall(wire.nats_connect(subject.decode()))
    for sock in socks:
        buffer = b""
        while True:
            line, buffer = _read_until(sock, buffer, b"\r\n")
            if line.startswith(b"-ERR"):
                raise RuntimeError(f"NATS refused: {line!r}")
            if line.startswith(b"PONG"):
                break
        yield _Conn(sock, buffer)


class _Loop:
    """The measuring loop of one worker."""

    def __init__(
        self, spec: WorkerSpec, conns: list[_Conn], pipe: Connection, counter: Synchronized[int]
    ) -> None:
        self.spec = spec
        self.pipe = pipe
        self.counter = counter
        self.by_fd = {c.sock.fileno(): c for c in conns}
        self.connections = len(conns)
        self.total = 0
        self.close_codes: dict[int, int] = {}
        self.histogram: Histogram | None = Histogram() if spec.latency else None
        self._mark()

    def _mark(self) -> None:
        self.marked_total = self.total
        self.marked_cpu = time.process_time()
        self.marked_wall = time.monotonic()
        if self.histogram is not None:
            self.histogram = Histogram()

    def _report(self) -> dict[str, Any]:
        return {
            "frames": self.total - self.marked_total,
            "histogram": self.histogram.to_wire() if self.histogram is not None else None,
            "cpu": time.process_time() - self.marked_cpu,
            "wall": time.monotonic() - self.marked_wall,
            "close_codes": self.close_codes,
            "connections": self.connections,
        }

    def run(self) -> None:
        poller = select.epoll()
        for fd, conn in self.by_fd.items():
            conn.sock.setblocking(False)
            poller.register(fd, select.EPOLLIN)
        control = self.pipe.fileno()
        poller.register(control, select.EPOLLIN)
        handle = self._websocket if self.spec.kind == "ws" else self._nats
        now = time.monotonic_ns()
        for conn in self.by_fd.values():  # bytes that came with the registration reply
            if conn.tail:
                data, conn.tail = conn.tail, b""
                handle(conn, data, now)
        while True:
            events = poller.poll(0.5)
            now = time.monotonic_ns()
            for fd, _ in events:
                if fd == control:
                    command = self.pipe.recv()[0]
                    if command == "mark":
                        self._mark()
                    elif command == "report":
                        self.pipe.send(("report", self._report()))
                    else:
                        for conn in self.by_fd.values():
                            conn.sock.close()
                        return
                    continue
                conn = self.by_fd[fd]
                try:
                    data = conn.sock.recv(1 << 18)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    poller.unregister(fd)
                    continue
                if conn.tail:
                    data = conn.tail + data
                    conn.tail = b""
                handle(conn, data, now)
            self.counter.value = self.total
            if self.spec.interval:
                time.sleep(self.spec.interval)

    def _websocket(self, conn: _Conn, data: bytes, now: int) -> None:
        frames, used = wire.ws_frames(data)
        if used < len(data):
            conn.tail = data[used:]
        histogram = self.histogram
        for opcode, start, end in frames:
            if opcode == wire.TEXT:
                self.total += 1
                if histogram is not None:
                    self._record(data, start, end, now, histogram)
            elif opcode == wire.PING:
                conn.sock.send(wire.client_frame(wire.PONG, data[start:end]))
            elif opcode == wire.CLOSE:
                code = wire.close_code(data, start, end)
                self.close_codes[code] = self.close_codes.get(code, 0) + 1

    def _nats(self, conn: _Conn, data: bytes, now: int) -> None:
        messages, used = wire.nats_messages(data)
        if used < len(data):
            conn.tail = data[used:]
        histogram = self.histogram
        for kind, start, end in messages:
            if kind == wire.NATS_MSG:
                self.total += 1
                if histogram is not None:
                    self._record(data, start, end, now, histogram)
            elif kind == wire.NATS_PING:
                conn.sock.send(b"PONG\r\n")

    def _record(self, data: bytes, start: int, end: int, now: int, histogram: Histogram) -> None:
        found = items.stamp_in(data, start, end)
        if found is not None:
            histogram.add(items.age_us(found, now, self.spec.origin_ns))
