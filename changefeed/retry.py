"""The one retry engine: which failures are retried, and after how long.

In the manner of websockets' reconnect (`backoff()` + one function that says whether an error
is retryable), and shared by every client that retries: the websocket listener's core
(`listener.state.ListenerCore`) and the pull consumer's (`listener.consumer_state`).

    is_retryable(error)   -> may the failure go away by itself?
    is_warning(error)     -> is it only worth reporting (ADR-37's missed heartbeat)?
    Retrier.failed(error, now)  -> the delay before the next attempt, or raises
    Retrier.answered()          -> the peer answered: the next failure starts from `initial`
    Retrier.healthy(now)        -> healthy since `now`: the same once that lasted `healthy_after`

Pure code: the caller passes the time in and does the sleeping.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from changefeed.backoff import Backoff
from changefeed.errors import (
    ConnectionFailed,
    HeartbeatMissed,
    ProtocolError,
    RetriesExhausted,
)


def is_retryable(error: BaseException) -> bool:
    """True when a failure may go away by itself: try again after a backoff delay.

    Everything else (a refused registration or pull, missed items, a bug) would fail the same
    way again, so it is raised to the application.
    """
    return isinstance(error, ConnectionFailed | ProtocolError)


def is_warning(error: BaseException) -> bool:
    """True for failures that are reported but are no failure of the peer's: ADR-37's missed
    heartbeat. The silence itself (twice the idle heartbeat) already paced the next attempt,
    and a quiet or slow publisher must not use up a bounded retry budget."""
    return isinstance(error, HeartbeatMissed)


class Retrier:
    """Failures in a row and their delays (`backoff.delays`), for one client.

    The count starts again when the peer answers (`answered`), or when the client stayed
    healthy (`healthy`) for `healthy_after` seconds before its next failure: a listener whose
    connection streamed for a while backs off from `initial` again rather than from where a past
    outage left it. `healthy_after=None` leaves only `answered`.
    """

    def __init__(
        self,
        backoff: Backoff,
        *,
        healthy_after: float | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.backoff = backoff
        self.healthy_after = healthy_after
        self.failures = 0
        """Failures in a row (warnings not counted): since the last answer or healthy period."""
        self._rng = rng or random.Random()
        self._delays: Iterator[float] = backoff.delays(self._rng)
        self._healthy_since: float | None = None

    def failed(self, error: BaseException, now: float = 0.0) -> float:
        """The seconds to wait before the next attempt.

        A warning (`is_warning`) costs nothing: 0, with no failure counted. Raises `error` when
        it is not retryable, and RetriesExhausted when the backoff's `retries` are used up.
        """
        since, self._healthy_since = self._healthy_since, None
        if (since is not None and self.healthy_after is not None
                and now - since >= self.healthy_after):
            self.answered()
        if not is_retryable(error):
            raise error
        if is_warning(error):
            return 0.0
        self.failures += 1
        delay = next(self._delays, None)
        if delay is None:
            raise RetriesExhausted(self.failures, error) from error
        return delay

    def answered(self) -> None:
        """The peer answered: the next failure waits `backoff.initial` again."""
        if self.failures:
            self.failures = 0
            self._delays = self.backoff.delays(self._rng)

    def healthy(self, now: float) -> None:
        """Healthy from `now` on: a failure `healthy_after` seconds later or more starts the
        count again (a failure earlier goes on where the last outage left it)."""
        self._healthy_since = now


__all__ = ["Retrier", "is_retryable", "is_warning"]
