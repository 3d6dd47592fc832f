"""The backoff schedule: a pure generator of delays."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from changefeed.backoff import Backoff


def test_delays_grow_by_the_factor_up_to_the_maximum() -> None:
    backoff = Backoff(initial=0.5, maximum=4, factor=2, jitter=0)
    assert list(itertools.islice(backoff.delays(), 6)) == [0.5, 1, 2, 4, 4, 4]


def test_jitter_draws_each_delay_below_its_nominal_value() -> None:
    backoff = Backoff(initial=1, maximum=8, factor=2, jitter=0.5)
    delays = list(itertools.islice(backoff.delays(random.Random(7)), 5))
    for delay, nominal in zip(delays, [1, 2, 4, 8, 8], strict=True):
        assert nominal * 0.5 <= delay <= nominal
    assert delays == list(itertools.islice(backoff.delays(random.Random(7)), 5))  # seeded


def test_retries_bound_the_number_of_delays() -> None:
    assert len(list(Backoff(retries=3).delays())) == 3
    assert list(Backoff(retries=0).delays()) == []
    assert len(list(itertools.islice(Backoff().delays(), 1000))) == 1000  # None: for ever


@pytest.mark.parametrize(
    "arguments",
    [{"initial": 0}, {"initial": 2, "maximum": 1}, {"factor": 0.5}, {"jitter": 1.5},
     {"jitter": -0.1}, {"retries": -1}],
)
def test_bad_settings_are_refused(arguments: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Backoff(**arguments)
