"""Token buckets per client address: requests per second and registrations per second.

Pure code with an injected clock. `take(key)` spends one token of `key`'s bucket and returns 0,
or returns the seconds until one is available (nothing spent): the `Retry-After`. Buckets that
have refilled completely are forgotten when the table grows past `most`, so a flood from many
addresses costs at most one entry per address active within a refill time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class TokenBuckets:
    """`rate` tokens per second per key, at most `burst` saved up."""

    def __init__(
        self,
        rate: float,
        burst: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        most: int = 100_000,
    ) -> None:
        self.rate = rate
        self.burst = burst if burst is not None else max(1, math.ceil(2 * rate))
        self._clock = clock
        self._most = most
        self._buckets: dict[str, tuple[float, float]] = {}
        """key -> (tokens, at)."""

    def take(self, key: str) -> float:
        now = self._clock()
        tokens, at = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        if tokens >= 1.0:
            if key not in self._buckets and len(self._buckets) >= self._most:
                self._forget(now)
            self._buckets[key] = (tokens - 1.0, now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1.0 - tokens) / self.rate

    def _forget(self, now: float) -> None:
        full = [
            key for key, (tokens, at) in self._buckets.items()
            if tokens + (now - at) * self.rate >= self.burst
        ]
        for key in full or list(self._buckets)[: len(self._buckets) // 2]:
            del self._buckets[key]


def retry_after(seconds: float) -> int:
    """Whole seconds for a `Retry-After` header: at least 1."""
    return max(1, math.ceil(seconds))


__all__ = ["TokenBuckets", "retry_after"]
