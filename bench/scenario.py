"""What every scenario shares: the run's context, and the result it reports (figure, baseline,
ratio, target, CPU used by each side). Pure data, no I/O."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from bench.clients import WorkerSpec, split
from bench.servers import Cores
from changefeed.protocol import ChangeKind, Registration


class ScenarioError(RuntimeError):
    """A side of a scenario did not do what is measured (delivered nothing, lost items, timed
    no item): its figure would mean nothing, so the scenario fails."""


@dataclass
class Figure:
    label: str
    """What was measured, e.g. "publisher, 1,000 listeners"."""
    value: float
    unit: str


@dataclass
class Check:
    """One target: a figure against its baseline, measured in the same run."""

    what: str
    figure: Figure
    baseline: Figure
    target: str
    met: bool | None
    """None when there is no target for this line (information only), or when the baseline did
    not do the job it is measured on (`note` says so)."""
    note: str = ""

    @property
    def ratio(self) -> float:
        return ratio(self.figure.value, self.baseline.value)


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of the rounds of a figure: what the docs show, never the best run."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return round(median, 3), round(ordered[0], 3), round(ordered[-1], 3)


def ratio(value: float, base: float) -> float:
    if base == 0:
        return math.inf if value else 1.0
    return round(value / base, 3)


@dataclass
class Result:
    id: str
    title: str
    checks: list[Check] = field(default_factory=list)
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)
    """run -> side -> cores used (CPU seconds / wall seconds) during the measured interval."""
    details: dict[str, Any] = field(default_factory=dict)
    charts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for check, raw in zip(self.checks, out["checks"], strict=True):
            raw["ratio"] = check.ratio
        primary = out["checks"][0] if out["checks"] else None
        out["figure"] = primary["figure"] if primary else None
        out["baseline"] = primary["baseline"] if primary else None
        out["ratio"] = primary["ratio"] if primary else None
        out["met"] = all(c.met for c in self.checks if c.met is not None) if self.checks else None
        plain: dict[str, Any] = orjson.loads(orjson.dumps(out, option=orjson.OPT_NON_STR_KEYS))
        return plain


@dataclass
class Context:
    quick: bool
    work: Path
    """Scratch directory: Redis data, configs, server logs."""
    charts: Path | None
    """Where PNG charts go; None without matplotlib."""
    cores: Cores
    profile: bool = False
    loop: str | None = None
    """`changefeed serve --loop` (None: the publisher's default, uvloop when installed)."""
    publisher_loops: set[str] = field(default_factory=set)
    """The event loops the publishers of this run said they ran on."""
    baseline_loops: set[str] = field(default_factory=set)
    """The event loops the baseline servers of this run said they ran on."""
    publisher_workers: int = 1
    """`changefeed serve --workers` (the publisher then runs on every core, the load too)."""
    source: Path | None = None
    """Run the publisher from this source tree (a patched copy) instead of the repository's."""
    results: dict[str, Result] = field(default_factory=dict)
    memo: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    """Runs that several scenarios report on (P1' and P2 share their rounds)."""

    def size(self, full: Any, quick: Any) -> Any:
        return quick if self.quick else full

    def workers(self, connections: int) -> int:
        """Client processes for `connections`: a few, so no single loop holds them all."""
        if connections <= 100:
            return 1
        return 2 if connections <= 2000 else 4

    def specs(
        self, port: int, registrations: list[bytes], *, latency: bool = False,
        origin_ns: int = 0, kind: Literal["ws", "nats"] = "ws", rcvbuf: int | None = None,
        sources: tuple[str, ...] = (), per_worker: int | None = None,
    ) -> list[WorkerSpec]:
        """Worker specs for `registrations`. In latency runs one worker in PROBE_SHARE of the
        connections reads eagerly and records each item's age; the others are bulk readers."""
        made: list[WorkerSpec] = []

        def spec(share: tuple[bytes, ...], probe: bool) -> WorkerSpec:
            made.append(WorkerSpec(
                kind, "127.0.0.1", port, share, latency=probe, origin_ns=origin_ns,
                cores=self.cores.load, rcvbuf=rcvbuf,
                source=sources[len(made) % len(sources)] if sources else None,
                interval=0.0 if probe else (LAZY if latency else EAGER_BULK),
            ))
            return made[-1]

        def workers(count: int) -> int:
            if per_worker is None:
                return self.workers(count)
            return -(-count // per_worker)

        if not latency:
            shares = split(registrations, workers(len(registrations)))
            return [spec(share, False) for share in shares]
        probes = max(1, round(len(registrations) * PROBE_SHARE))
        out = [spec(tuple(registrations[:probes]), True)]
        rest = registrations[probes:]
        if rest:
            out += [spec(share, False) for share in split(rest, workers(len(rest)))]
        return out


PROBE_SHARE = 0.05
"""Latency runs: the share of the listeners whose items are timed (read as soon as they arrive)."""
LAZY = 0.02
"""Seconds between polls of the other listeners of a latency run."""
EAGER_BULK = 0.01
"""Seconds between polls in throughput runs: reads gather a few items each."""


def v1(sub: str, number: int = 0) -> bytes:
    """A v1 registration for `vm` and one sub-resource."""
    kind = ChangeKind("vm", (sub,))
    return orjson.dumps(Registration(f"bench-{number:06d}", "bench", (kind,), 1).to_wire())


def listeners(count: int, subs: tuple[str, ...] = ("nic",)) -> list[bytes]:
    """`count` registrations spread round-robin over `subs`."""
    return [v1(subs[n % len(subs)], n) for n in range(count)]
