"""Latency histograms that merge across processes: 10 µs buckets up to 2 s, exact above. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

STEP_US = 10
LIMIT_US = 2_000_000


class Histogram:
    def __init__(self) -> None:
        self.counts = [0] * (LIMIT_US // STEP_US)
        self.over: list[int] = []
        self.count = 0
        self.max_us = 0

    def add(self, us: int) -> None:
        self.count += 1
        if us > self.max_us:
            self.max_us = us
        if us < LIMIT_US:
            self.counts[max(us, 0) // STEP_US] += 1
        else:
            self.over.append(us)

    def to_wire(self) -> dict[str, Any]:
        """A compact form to send between processes."""
        return {
            "buckets": {i: c for i, c in enumerate(self.counts) if c},
            "over": self.over,
            "count": self.count,
            "max_us": self.max_us,
        }

    @classmethod
    def merged(cls, wires: Iterable[dict[str, Any]]) -> Histogram:
        total = cls()
        for wire in wires:
            for index, count in wire["buckets"].items():
                total.counts[int(index)] += count
            total.over.extend(wire["over"])
            total.count += wire["count"]
            total.max_us = max(total.max_us, wire["max_us"])
        return total

    def percentile(self, p: float) -> float:
        """The p-th percentile in milliseconds (upper edge of its bucket); 0 when empty."""
        if not self.count:
            return 0.0
        rank = max(1, round(self.count * p / 100))
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return min((index + 1) * STEP_US, self.max_us) / 1000
        over = sorted(self.over)
        return over[min(rank - seen, len(over)) - 1] / 1000

    def summary(self) -> dict[str, float]:
        return {
            "p50_ms": self.percentile(50),
            "p99_ms": self.percentile(99),
            "max_ms": self.max_us / 1000,
            "samples": self.count,
        }

    def cdf(self, points: int = 200) -> list[tuple[float, float]]:
        """(latency ms, fraction at or below) pairs for a chart."""
        if not self.count:
            return []
        out = []
        seen = 0
        every = max(1, self.count // points)
        for index, count in enumerate(self.counts):
            if not count:
                continue
            before = seen
            seen += count
            if seen // every != before // every or seen == self.count:
                out.append(((index + 1) * STEP_US / 1000, seen / self.count))
        for us in sorted(self.over):
            seen += 1
            if seen % every == 0 or seen == self.count:
                out.append((us / 1000, seen / self.count))
        return out
