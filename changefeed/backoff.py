"""Exponential backoff with jitter, as a pure generator of delays.

The I/O layers (the publisher's tail, the listener's reconnect loop) consume it; nothing here
sleeps or reads a clock.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays start at `initial` seconds and grow by `factor` up to `maximum`.

    Each delay is drawn uniformly from [delay * (1 - jitter), delay] ("full jitter" when
    jitter is 1). `retries` bounds the number of delays; None means retry for ever.
    """

    initial: float = 0.1
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5
    retries: int | None = None

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum < self.initial:
            raise ValueError("backoff needs 0 < initial <= maximum")
        if self.factor < 1:
            raise ValueError("backoff factor must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("backoff jitter must be within [0, 1]")
        if self.retries is not None and self.retries < 0:
            raise ValueError("backoff retries must be >= 0 or None")

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """Yield the delays to wait before each retry; stops after `retries` delays."""
        draw = (rng or random.Random()).random
        delay = self.initial
        attempt = 0
        while self.retries is None or attempt < self.retries:
            attempt += 1
            yield delay * (1 - self.jitter * draw())
            delay = min(delay * self.factor, self.maximum)
