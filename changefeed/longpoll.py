"""The wire format of the `events` long poll (Tendermint ADR-075), spoken by both sides.

The publisher parses requests (`from_query`, `from_params`) and writes replies
(`EventsReply.to_wire`); the listener's pull consumer writes requests (`EventsQuery.to_query`) and
reads replies (`EventsReply.parse`). `GET /changefeeds/events?...` and the JSON-RPC 2.0 method
`events` (POST /changefeeds/rpc) take the same parameters and give the same reply
(docs/pull.md):

- eligible items are newer than `after` and older than `before` and match `filter`;
- the reply holds up to `max_results` of the *newest* eligible items, newest first, with `more`
  (older eligible items were left out), `oldest` and `newest` (the whole retained log);
- with `before` empty and nothing eligible, the request waits up to `wait_time` for new items;
- an `after` cursor older than the retained log, or of another bucket epoch, is reported in the
  reply as `missed`, never silently read as "from the start".

`order: "oldest"` is our extension for forward readers (the listener's pull consumer): the
*oldest* eligible items after `after`, oldest first, `more` meaning newer ones were left out.

Pure code: no sockets, no clocks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from changefeed.cursor import Position
from changefeed.errors import CursorError, ParamError, ProtocolError
from changefeed.protocol import WILDCARD, ChangeItem, Resource, decode_item
from changefeed.watch import EVERYTHING, Watch, parse_watch

DEFAULT_RESULTS = 100
"""Items in a reply when the request names no number (config.js `limits.results`)."""
MAX_RESULTS = 1000
"""The most items a publisher returns by default (config.js `limits.maxResults`)."""
DEFAULT_WAIT = 10.0
"""Seconds a long poll waits when the request names no wait (config.js `limits.wait`)."""
MAX_WAIT = 60.0
"""The longest wait a publisher honours by default (config.js `limits.maxWait`)."""

QUERY_SINGLE = ("resource", "max_results", "after", "before", "wait_time", "order")
"""The query parameters of `GET /changefeeds/events` given at most once."""
QUERY_REPEATED = ("sub", "id", "prefix")
"""The query parameters of `GET /changefeeds/events` that may repeat."""
QUERY_PARAMETERS = QUERY_SINGLE[:1] + QUERY_REPEATED + QUERY_SINGLE[1:]
"""The query parameters of `GET /changefeeds/events` (the route's `takes` checks the names)."""
PARAMS = ("filter", "max_results", "after", "before", "wait_time", "order")
"""The keys of a JSON-RPC `events` call's params."""
FILTER_KEYS = ("resource", "subResources", "ids", "prefixes")

_DURATION = re.compile(r"^\s*(-?(?:\d+(?:\.\d*)?|\.\d+))\s*(ms|s|m)?\s*$")
_INTEGER = re.compile(r"^\s*-?[0-9]+\s*$")


class PollLimits(Protocol):
    """What a publisher allows (`publisher.config.settings.Limits` is one)."""

    @property
    def results(self) -> int: ...
    @property
    def max_results(self) -> int: ...
    @property
    def wait(self) -> float: ...
    @property
    def max_wait(self) -> float: ...


class Described(Protocol):
    """Anything that names a change: a `ChangeItem`, or a log entry of the bucket."""

    @property
    def resource(self) -> str: ...
    @property
    def sub_resources(self) -> tuple[str, ...]: ...
    @property
    def changed_resource_id(self) -> str: ...


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which items a request is for: a resource (None: all), sub-resources (empty: all) and a
    watch on ids."""

    resource: str | None = None
    sub_resources: frozenset[str] = frozenset()
    watch: Watch = EVERYTHING

    def matches(self, change: Described) -> bool:
        if self.resource is not None and change.resource != self.resource:
            return False
        if self.sub_resources and self.sub_resources.isdisjoint(change.sub_resources):
            return False
        return self.watch.matches(change.changed_resource_id)

    def to_query(self) -> list[tuple[str, str]]:
        params = [] if self.resource is None else [("resource", self.resource)]
        params += [("sub", sub) for sub in sorted(self.sub_resources)]
        return params + self.watch.to_query()


@dataclass(frozen=True, slots=True)
class EventsRequest:
    """One request, as the publisher runs it (limits applied)."""

    filter: EventFilter
    max_results: int
    after: Position | None
    """A single-position cursor, or a composite one (a bucket in a Redis Cluster)."""
    before: Position | None
    wait: float
    oldest_first: bool = False


@dataclass(frozen=True, slots=True)
class EventsQuery:
    """One forward pull, as the listener sends it: the oldest items after `after`."""

    filter: EventFilter
    after: str | None
    max_results: int
    wait_time: float

    def to_query(self) -> list[tuple[str, str]]:
        """The query string. The wait goes in whole milliseconds: `0ms` (answer at once) only
        for no wait, a tiny wait as `1ms`."""
        wait_ms = max(1, round(self.wait_time * 1000)) if self.wait_time > 0 else 0
        params = [("order", "oldest"), ("max_results", str(self.max_results)),
                  ("wait_time", f"{wait_ms}ms")]
        if self.after:
            params.append(("after", self.after))
        return params + self.filter.to_query()


@dataclass(frozen=True, slots=True)
class EventsReply:
    """A 200 answer of `events`: `items` in the reply's order, each with its cursor; `oldest` and
    `newest` the retained log's ends ("" when it is empty); `missed` when items after the
    request's `after` may be gone (`missed_reason` says why). `resume_after`, with `missed` and
    no items, is the cursor of the request's own position in a new epoch of the bucket: its
    entry is in the new history, nothing was lost, and the reader asks after it next."""

    items: tuple[ChangeItem, ...]
    more: bool
    oldest: str
    newest: str
    missed: bool = False
    missed_reason: str = ""
    resume_after: str = ""

    def to_wire(self) -> dict[str, Any]:
        reply: dict[str, Any] = {
            "items": [
                {"cursor": item.cursor, "data": {"type": "change", "value": item.to_wire()}}
                for item in self.items
            ],
            "more": self.more,
            "oldest": self.oldest,
            "newest": self.newest,
            "missed": self.missed,
        }
        if self.missed:
            reply["missed_reason"] = self.missed_reason
        if self.resume_after:
            reply["resume_after"] = self.resume_after
        return reply

    @classmethod
    def parse(cls, body: bytes | str) -> EventsReply:
        """Read a reply. Raises ProtocolError when it is not of the documented form."""
        try:
            reply = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise ProtocolError(f"events reply is not JSON: {body!r:.200}") from None
        if not isinstance(reply, dict) or not isinstance(reply.get("items"), list):
            raise ProtocolError(f"events reply is not an object with items: {body!r:.200}")
        items = []
        for entry in reply["items"]:
            data = entry.get("data") if isinstance(entry, dict) else None
            if not isinstance(data, dict) or data.get("type") != "change" or not isinstance(
                data.get("value"), dict
            ):
                raise ProtocolError(
                    f"events reply holds an entry that is not a change: {entry!r:.200}"
                )
            item = decode_item(data["value"])
            cursor = entry.get("cursor")
            if not item.cursor and isinstance(cursor, str):
                item = ChangeItem(item.resource, item.sub_resources, item.changed_resource_id,
                                  item.published, cursor)
            if not item.cursor:
                raise ProtocolError(f"events reply holds an item without a cursor: {entry!r:.200}")
            items.append(item)
        return cls(
            tuple(items),
            reply.get("more") is True,
            _text(reply, "oldest"),
            _text(reply, "newest"),
            reply.get("missed") is True,
            _text(reply, "missed_reason"),
            _text(reply, "resume_after"),
        )


def _text(reply: dict[str, Any], key: str) -> str:
    value = reply.get(key)
    return value if isinstance(value, str) else ""


# --- parsing: the query string and JSON-RPC params give the same EventsRequest ---------------


def parse_duration(name: str, value: Any) -> float:
    """Seconds from a number of seconds or a string such as ``"500ms"``, ``"5s"``, ``"1m"``."""
    if isinstance(value, bool):
        raise ParamError(f"{name} must be a number of seconds or a duration such as '5s'")
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(value) if isinstance(value, str) and value.isascii() else None
    if match is None:
        raise ParamError(f"{name} must be a number of seconds or a duration such as '5s'")
    number, unit = float(match.group(1)), match.group(2) or "s"
    return number * {"ms": 0.001, "s": 1.0, "m": 60.0}[unit]


def parse_wait(name: str, value: Any, limits: PollLimits) -> float:
    """How long a request waits, by the one rule of every route (docs/pull.md, "How long a
    request waits"): `value` None (absent) is `limits.wait`; otherwise a duration
    (`parse_duration`) where 0 answers at once, a negative one is refused, and one above
    `limits.max_wait` is lowered to it."""
    if value is None:
        return min(limits.wait, limits.max_wait)
    wait = parse_duration(name, value)
    if not math.isfinite(wait):
        raise ParamError(f"{name} must be a finite number of seconds")
    if wait < 0:
        raise ParamError(
            f"{name} must not be negative ({value!r:.40}): 0 answers at once, and leaving it "
            f"out waits the default ({limits.wait:g} s)"
        )
    return min(wait, limits.max_wait)


def parse_int(name: str, value: Any) -> int:
    """An integer from a JSON number or a string of ASCII digits (``'²'`` is not one)."""
    if isinstance(value, bool):
        raise ParamError(f"{name} must be an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and _INTEGER.match(value):
        return int(value)
    raise ParamError(f"{name} must be an integer")


def _cursor(name: str, value: Any) -> Position | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ParamError(f"{name} must be a cursor string")
    try:
        return Position.decode(value)
    except CursorError as exc:
        raise ParamError(f"{name}: {exc}") from None


QUERY_NAMES = ("resource", "sub", "id", "prefix")
"""What the query string calls a filter's resource, sub-resources, ids and prefixes."""
PARAMS_NAMES = tuple(f"filter.{key}" for key in FILTER_KEYS)
"""What JSON-RPC params call them."""


def filter_of(
    resource: Any, subs: Any, ids: Any, prefixes: Any, resources: Mapping[str, Resource],
    names: tuple[str, ...],
) -> EventFilter:
    """The filter of a request; errors name its parameters as the request did (`names`:
    `QUERY_NAMES` or `PARAMS_NAMES`)."""
    resource_name, subs_name, ids_name, prefixes_name = names
    if resource is None or resource == "":
        if subs:
            raise ParamError(f"{subs_name} needs {resource_name}: the resource whose "
                             f"sub-resources they are (known: {', '.join(sorted(resources))})")
        name = None
    elif not isinstance(resource, str) or resource not in resources:
        known = ", ".join(sorted(resources))
        raise ParamError(f"{resource_name}: unknown resource {resource!r} (known: {known})")
    else:
        name = resource
    sub_set: frozenset[str] = frozenset()
    if subs:
        if not isinstance(subs, list) or not all(isinstance(s, str) for s in subs):
            raise ParamError(f"{subs_name} must be a list of strings")
        assert name is not None
        known_subs = resources[name].sub_resources
        for sub in subs:
            if sub != WILDCARD and sub not in known_subs:
                raise ParamError(
                    f"{subs_name}: unknown sub-resource {sub!r} of {name!r} "
                    f"(known: {', '.join(known_subs)}, or '*')"
                )
        sub_set = frozenset() if WILDCARD in subs else frozenset(subs)
    try:
        watch = parse_watch(ids, prefixes, names=(ids_name, prefixes_name))
    except ValueError as exc:
        raise ParamError(str(exc)) from None
    return EventFilter(name, sub_set, watch)


def _request(
    filter: EventFilter,
    max_results: Any,
    after: Any,
    before: Any,
    wait_time: Any,
    order: Any,
    limits: PollLimits,
) -> EventsRequest:
    count = limits.results if max_results is None else parse_int("max_results", max_results)
    if count <= 0:
        count = limits.results  # the ADR: zero or negative asks for the default
    wait = parse_wait("wait_time", wait_time, limits)
    if order not in (None, "newest", "oldest"):
        raise ParamError("order must be 'newest' (the default) or 'oldest'")
    return EventsRequest(
        filter,
        min(count, limits.max_results),
        _cursor("after", after),
        _cursor("before", before),
        wait,
        order == "oldest",
    )


def from_query(
    query: Mapping[str, str],
    getall: Callable[[str], Sequence[str]],
    resources: Mapping[str, Resource],
    limits: PollLimits,
) -> EventsRequest:
    """The request of `GET /changefeeds/events?...` (`getall(name)` lists a repeated parameter),
    whose names the route has checked (`QUERY_SINGLE` at most once, `QUERY_REPEATED`)."""
    filter = filter_of(
        query.get("resource"),
        list(getall("sub")) or None,
        list(getall("id")) or None,
        list(getall("prefix")) or None,
        resources,
        QUERY_NAMES,
    )
    return _request(
        filter,
        query.get("max_results"),
        query.get("after"),
        query.get("before"),
        query.get("wait_time"),
        query.get("order"),
        limits,
    )


def from_params(
    params: Any, resources: Mapping[str, Resource], limits: PollLimits
) -> EventsRequest:
    """The request of a JSON-RPC `events` call's params (an object, or absent)."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ParamError("params must be an object")
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise ParamError(f"unknown param(s) {', '.join(unknown)} (known: {', '.join(PARAMS)})")
    spec = params.get("filter") or {}
    if not isinstance(spec, dict):
        raise ParamError("filter must be an object")
    unknown = sorted(set(spec) - set(FILTER_KEYS))
    if unknown:
        raise ParamError(
            f"unknown filter key(s) {', '.join(unknown)} (known: {', '.join(FILTER_KEYS)})"
        )
    filter = filter_of(
        spec.get("resource"),
        spec.get("subResources"),
        spec.get("ids"),
        spec.get("prefixes"),
        resources,
        PARAMS_NAMES,
    )
    return _request(
        filter,
        params.get("max_results"),
        params.get("after"),
        params.get("before"),
        params.get("wait_time"),
        params.get("order"),
        limits,
    )


__all__ = [
    "DEFAULT_RESULTS",
    "DEFAULT_WAIT",
    "MAX_RESULTS",
    "MAX_WAIT",
    "PARAMS_NAMES",
    "QUERY_NAMES",
    "EventFilter",
    "EventsQuery",
    "EventsReply",
    "EventsRequest",
    "PollLimits",
    "filter_of",
    "from_params",
    "from_query",
    "parse_duration",
    "parse_int",
    "parse_wait",
]
