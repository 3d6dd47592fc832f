"""The pull consumer's options and filter, validated synchronously: no event loop."""

from __future__ import annotations

import math
from typing import Any

import pytest

from changefeed.errors import InvalidOption, ListenerError
from changefeed.longpoll import EventFilter
from changefeed.watch import Watch
from listener.consumer_options import (
    ConsumeOptions,
    consume_options,
    event_filter,
    fetch_options,
)

# --- options ----------------------------------------------------------------------------------


def test_consume_defaults_follow_the_adr() -> None:
    assert consume_options() == ConsumeOptions(500, None, 250, None, 30.0, 15.0)
    assert consume_options(max_bytes=1000) == ConsumeOptions(None, 1000, None, 500, 30.0, 15.0)
    assert consume_options(max_messages=1).threshold_messages == 0
    assert consume_options(expires=120).idle_heartbeat == 30.0  # half of expires, capped at 30 s
    assert consume_options(expires=1).idle_heartbeat == 0.5
    assert consume_options(max_messages=10, threshold_messages=10).threshold_messages == 10
    assert fetch_options(5).max_messages == 5 and fetch_options(max_bytes=9).max_bytes == 9


@pytest.mark.parametrize(
    ("arguments", "option"),
    [
        ({"max_messages": 10, "max_bytes": 100}, "max_bytes"),  # exclusive
        ({"max_messages": 0}, "max_messages"),
        ({"max_messages": True}, "max_messages"),
        ({"max_messages": 2.5}, "max_messages"),
        ({"max_bytes": -1}, "max_bytes"),
        ({"max_messages": 10, "threshold_messages": 11}, "threshold_messages"),  # above its limit
        ({"threshold_messages": 501}, "threshold_messages"),  # above the default limit
        ({"threshold_messages": -1}, "threshold_messages"),
        ({"max_bytes": 100, "threshold_bytes": 101}, "threshold_bytes"),
        ({"threshold_bytes": 10}, "threshold_bytes"),  # no max_bytes to apply to
        ({"max_bytes": 100, "threshold_messages": 10}, "threshold_messages"),
        ({"expires": 0.5}, "expires"),  # the ADR's minimum is 1 s
        ({"expires": math.nan}, "expires"),
        ({"expires": "30"}, "expires"),
        ({"idle_heartbeat": 0.4}, "idle_heartbeat"),  # minimum 500 ms
        ({"expires": 100, "idle_heartbeat": 31}, "idle_heartbeat"),  # maximum 30 s
        ({"expires": 10, "idle_heartbeat": 6}, "idle_heartbeat"),  # above expires / 2
    ],
)
def test_consume_options_are_refused_naming_the_option(
    arguments: dict[str, Any], option: str
) -> None:
    with pytest.raises(InvalidOption) as caught:
        consume_options(**arguments)
    assert caught.value.option == option
    assert option in str(caught.value)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, ListenerError)


@pytest.mark.parametrize(
    ("arguments", "option"),
    [
        ({}, "max_messages"),  # one of the two is required
        ({"max_messages": 1, "max_bytes": 1}, "max_bytes"),
        ({"max_messages": 1, "expires": 0}, "expires"),
    ],
)
def test_fetch_options_are_refused_naming_the_option(arguments: dict[str, Any], option: str
                                                     ) -> None:
    with pytest.raises(InvalidOption) as caught:
        fetch_options(**arguments)
    assert caught.value.option == option


# --- what to pull -----------------------------------------------------------------------------


def test_the_filter_names_a_resource_its_sub_resources_and_a_watch() -> None:
    assert event_filter("vm", ["nic", "alias", "nic"], ids=["b", "a"], prefixes=["srv/"]) == (
        EventFilter("vm", frozenset({"nic", "alias"}), Watch.of(ids=["a", "b"],
                                                                 prefixes=["srv"])))
    assert event_filter() == EventFilter()
    assert event_filter("vm", ["*"]) == event_filter("vm")  # "*": every sub-resource


@pytest.mark.parametrize(
    ("arguments", "option"),
    [
        ({"sub_resources": ["nic"]}, "sub_resources"),  # needs a resource
        ({"resource": "vm", "sub_resources": "nic"}, "sub_resources"),  # one string, not a list
        ({"resource": ""}, "resource"),
        ({"ids": [""]}, "ids"),
        ({"prefixes": ["/"]}, "ids/prefixes"),
    ],
)
def test_a_bad_filter_is_refused(arguments: dict[str, Any], option: str) -> None:
    with pytest.raises(InvalidOption) as caught:
        event_filter(**arguments)
    assert caught.value.option == option
