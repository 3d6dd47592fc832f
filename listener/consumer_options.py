"""The pull consumer's options and what it pulls, validated as ADR-37 says: pure code.

    fetch_options(...), consume_options(...)  -> FetchOptions, ConsumeOptions
    event_filter(resource, subs, ids, prefixes) -> the `changefeed.longpoll.EventFilter` to pull

A wrong value raises InvalidOption naming the option, the value and what was expected, when
the consumer is created or the operation called: never later, from a background pull.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from changefeed.errors import InvalidOption
from changefeed.longpoll import EventFilter
from changefeed.protocol import WILDCARD
from changefeed.watch import parse_watch

DEFAULT_MAX_MESSAGES = 500
"""ADR-37: "probably between 100 and 1000"."""
DEFAULT_EXPIRES = 30.0
MIN_EXPIRES = 1.0
MIN_HEARTBEAT = 0.5
MAX_HEARTBEAT = 30.0


@dataclass(frozen=True, slots=True)
class FetchOptions:
    """One fetch: up to `max_messages` items or `max_bytes` bytes (exactly one is set), within
    `expires` seconds; each long poll waits at most `idle_heartbeat`."""

    max_messages: int | None
    max_bytes: int | None
    expires: float
    idle_heartbeat: float


@dataclass(frozen=True, slots=True)
class ConsumeOptions:
    """A consume's buffer: at most `max_messages` items or `max_bytes` bytes (exactly one is
    set), refilled when it holds `threshold_messages` items / `threshold_bytes` bytes or fewer."""

    max_messages: int | None
    max_bytes: int | None
    threshold_messages: int | None
    threshold_bytes: int | None
    expires: float
    idle_heartbeat: float


def _positive_int(option: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOption(option, value, "an integer >= 1")
    return value


def _timing(expires: Any, idle_heartbeat: Any) -> tuple[float, float]:
    """ADR-37: expires >= 1 s; idle_heartbeat defaults to expires/2 capped at 30 s, and lies
    within [0.5 s, 30 s] and at most expires/2 (so a heartbeat can be missed before expiry)."""
    if isinstance(expires, bool) or not isinstance(expires, int | float) or not (
        math.isfinite(expires) and expires >= MIN_EXPIRES
    ):
        raise InvalidOption("expires", expires, f"a number of seconds >= {MIN_EXPIRES:g}")
    expires = float(expires)
    if idle_heartbeat is None:
        return expires, min(expires / 2, MAX_HEARTBEAT)
    highest = min(MAX_HEARTBEAT, expires / 2)
    if isinstance(idle_heartbeat, bool) or not isinstance(idle_heartbeat, int | float) or not (
        MIN_HEARTBEAT <= idle_heartbeat <= highest
    ):
        raise InvalidOption(
            "idle_heartbeat", idle_heartbeat,
            f"seconds from {MIN_HEARTBEAT:g} to {highest:g} (30 s, and at most expires/2)",
        )
    return expires, float(idle_heartbeat)


def _limit(max_messages: Any, max_bytes: Any, default: int | None) -> tuple[int | None, int | None]:
    if max_messages is not None and max_bytes is not None:
        raise InvalidOption("max_bytes", max_bytes,
                            "not to be given with max_messages: the two are exclusive")
    if max_bytes is not None:
        return None, _positive_int("max_bytes", max_bytes)
    if max_messages is None:
        if default is None:
            raise InvalidOption("max_messages", None, "max_messages or max_bytes")
        return default, None
    return _positive_int("max_messages", max_messages), None


def fetch_options(
    max_messages: Any = None,
    max_bytes: Any = None,
    expires: Any = DEFAULT_EXPIRES,
    idle_heartbeat: Any = None,
) -> FetchOptions:
    """Validated fetch options. One of max_messages and max_bytes is required (ADR-37)."""
    messages, size = _limit(max_messages, max_bytes, None)
    expires, heartbeat = _timing(expires, idle_heartbeat)
    return FetchOptions(messages, size, expires, heartbeat)


def consume_options(
    max_messages: Any = None,
    max_bytes: Any = None,
    threshold_messages: Any = None,
    threshold_bytes: Any = None,
    expires: Any = DEFAULT_EXPIRES,
    idle_heartbeat: Any = None,
) -> ConsumeOptions:
    """Validated consume options with ADR-37's defaults: max_messages 500 unless max_bytes is
    given (the two are exclusive); each threshold 50% of its limit and not above it."""
    messages, size = _limit(max_messages, max_bytes, DEFAULT_MAX_MESSAGES)
    expires, heartbeat = _timing(expires, idle_heartbeat)
    return ConsumeOptions(
        messages, size,
        _threshold("threshold_messages", threshold_messages, messages, "max_messages"),
        _threshold("threshold_bytes", threshold_bytes, size, "max_bytes"),
        expires, heartbeat,
    )


def _threshold(option: str, value: Any, limit: int | None, limit_name: str) -> int | None:
    if limit is None:
        if value is not None:
            raise InvalidOption(option, value, f"nothing: it applies to {limit_name}, not set")
        return None
    if value is None:
        return limit // 2
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise InvalidOption(option, value, f"an integer from 0 to {limit_name} ({limit})")
    return value


def event_filter(
    resource: str | None = None,
    sub_resources: Iterable[str] = (),
    ids: Iterable[str] = (),
    prefixes: Iterable[str] = (),
) -> EventFilter:
    """What a consumer pulls: a resource (every one when None), some of its sub-resources (all
    when empty or ``"*"``), and a watch on ids and id prefixes (every id when empty).

    The publisher checks the names against its resources; this checks what it can without
    them, so that a mistake raises InvalidOption naming the argument at once.
    """
    if resource is not None and (not isinstance(resource, str) or not resource):
        raise InvalidOption("resource", resource, "a resource name, or None for all")
    subs = _names("sub_resources", sub_resources)
    if subs and resource is None:
        raise InvalidOption("sub_resources", list(subs), "a resource to go with them")
    id_list, prefix_list = list(_names("ids", ids)), list(_names("prefixes", prefixes))
    try:
        watch = parse_watch(id_list, prefix_list)
    except ValueError as exc:
        raise InvalidOption("ids/prefixes", None, str(exc)) from None
    sub_set = frozenset() if WILDCARD in subs else frozenset(subs)
    return EventFilter(resource, sub_set, watch)


def _names(option: str, values: Iterable[str]) -> tuple[str, ...]:
    if isinstance(values, str):
        raise InvalidOption(option, values, "a list of strings, not one string")
    names = tuple(values)
    if not all(isinstance(name, str) and name for name in names):
        raise InvalidOption(option, list(names), "non-empty strings")
    return tuple(dict.fromkeys(names))
