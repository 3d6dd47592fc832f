"""The retry engine, driven synchronously: no event loop, no clock, no sleeps."""

from __future__ import annotations

import random

import pytest

from changefeed.backoff import Backoff
from changefeed.errors import (
    BootstrapFailed,
    BufferOverflow,
    ConfigError,
    ConnectionLost,
    HeartbeatMissed,
    InvalidOption,
    ItemsMissed,
    ProtocolError,
    PullFailed,
    PullRejected,
    RegistrationRejected,
    RetriesExhausted,
)
from changefeed.retry import Retrier, is_retryable, is_warning

URL = "http://pub:8080"
DOUBLING = Backoff(initial=1, maximum=8, factor=2, jitter=0)


def refused() -> PullFailed:
    return PullFailed(URL, "ConnectionRefusedError")


@pytest.mark.parametrize(
    "error",
    [ConnectionLost(URL, "reset", 1006), BootstrapFailed(URL, "HTTP 500", 500), BufferOverflow(3),
     PullFailed(URL, "HTTP 503", 503), HeartbeatMissed(URL, 2), ProtocolError("garbage")],
)
def test_failures_that_may_go_away_are_retryable(error: Exception) -> None:
    assert is_retryable(error)


@pytest.mark.parametrize(
    "error",
    [RegistrationRejected(URL, 1008, "unknown resource"), PullRejected(URL, 400, "x", "bad"),
     ItemsMissed("e.1", "e.5"), InvalidOption("max_messages", 0, "an integer >= 1"),
     ConfigError("k", 1, "a string"), RetriesExhausted(3, refused()), ValueError("a bug")],
)
def test_failures_that_would_fail_again_are_not(error: Exception) -> None:
    assert not is_retryable(error)
    with pytest.raises(type(error)):
        Retrier(DOUBLING).failed(error)


def test_only_a_missed_heartbeat_is_a_warning() -> None:
    assert is_warning(HeartbeatMissed(URL, 2))
    assert not is_warning(refused()) and not is_warning(ProtocolError("x"))


def test_delays_follow_the_backoff_and_are_counted() -> None:
    retrier = Retrier(DOUBLING)
    assert [retrier.failed(refused()) for _ in range(5)] == [1, 2, 4, 8, 8]
    assert retrier.failures == 5


def test_an_answer_starts_the_delays_again() -> None:
    retrier = Retrier(DOUBLING)
    retrier.failed(refused())
    retrier.failed(refused())
    retrier.answered()
    assert retrier.failures == 0
    assert retrier.failed(refused()) == 1


def test_a_healthy_period_starts_the_delays_again_only_once_it_lasted() -> None:
    retrier = Retrier(DOUBLING, healthy_after=30)
    for _ in range(3):
        retrier.failed(refused(), now=0)
    retrier.healthy(now=0)
    assert retrier.failed(refused(), now=10) == 8  # healthy for 10 s only: not long enough
    assert retrier.failures == 4
    retrier.healthy(now=10)
    assert retrier.failed(refused(), now=40) == 1
    assert retrier.failures == 1
    assert retrier.failed(refused(), now=100) == 2  # no healthy period in between


def test_without_healthy_after_only_an_answer_resets() -> None:
    retrier = Retrier(DOUBLING)
    retrier.failed(refused(), now=0)
    retrier.healthy(now=0)
    assert retrier.failed(refused(), now=1000) == 2


def test_retries_are_bounded_and_the_last_failure_kept() -> None:
    retrier = Retrier(Backoff(initial=1, maximum=1, retries=2), rng=random.Random(0))
    retrier.failed(refused())
    retrier.failed(refused())
    last = ProtocolError("garbage")
    with pytest.raises(RetriesExhausted) as caught:
        retrier.failed(last)
    assert caught.value.attempts == 3 and caught.value.last is last


def test_a_missed_heartbeat_spends_no_retry_and_no_delay() -> None:
    """ADR-37 calls a missed heartbeat a warning: a quiet publisher must not exhaust a bounded
    retry budget, nor make the next real failure wait longer."""
    retrier = Retrier(Backoff(initial=1, maximum=8, jitter=0, retries=1))
    for _ in range(10):
        assert retrier.failed(HeartbeatMissed(URL, 2)) == 0
    assert retrier.failures == 0
    assert retrier.failed(refused()) == 1  # the first delay, and the one retry allowed
    assert retrier.failed(HeartbeatMissed(URL, 2)) == 0  # still not counted
    with pytest.raises(RetriesExhausted) as caught:
        retrier.failed(refused())
    assert caught.value.attempts == 2
