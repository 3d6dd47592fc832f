"""The `events` long-poll of Tendermint ADR-075, over the change bucket's log.

`GET /changefeeds/events?...` and the JSON-RPC 2.0 method `events` (POST /changefeeds/rpc) take
the same parameters and give the same reply (docs/events.md):

- eligible items are newer than `after` and older than `before` and match `filter`;
- the reply holds up to `max_results` of the *newest* eligible items, newest first, with `more`
  (older eligible items were left out), `oldest` and `newest` (the whole retained log);
- with `before` empty and nothing eligible, the request waits up to `wait_time` for new items;
- an `after` cursor older than the retained log, or of another bucket epoch, is reported in the
  reply as `missed`, never silently read as "from the start".

`order: "oldest"` is our extension for forward readers (the listener's pull consumer): the
*oldest* eligible items after `after`, oldest first, `more` meaning newer ones were left out.

The publisher keeps no state per client: each request scans the shared log in Redis, and a
waiting request waits on the hub's one shared "new entries" event.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from publisher.bucket import LogEntry, Retention
from publisher.cursor import Cursor, StreamId
from publisher.errors import ChangefeedError, CursorError
from publisher.protocol import WILDCARD, Resource
from publisher.watch import EVERYTHING, Watch, parse_watch

if TYPE_CHECKING:
    from publisher.bucket import ChangeBucket
    from publisher.config import Limits
    from publisher.hub import Hub

SCAN = 1000
"""Log entries read per Redis call while looking for eligible items."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m)?\s*$")


class ParamError(ChangefeedError):
    """A request parameter is invalid; the message names it (a 400, or JSON-RPC -32602)."""


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which items a request is for: a resource (None: all), sub-resources (empty: all) and a
    watch on ids."""

    resource: str | None = None
    sub_resources: frozenset[str] = frozenset()
    watch: Watch = EVERYTHING

    def matches(self, entry: LogEntry) -> bool:
        if self.resource is not None and entry.resource != self.resource:
            return False
        if self.sub_resources and self.sub_resources.isdisjoint(entry.sub_resources):
            return False
        return self.watch.matches(entry.changed_resource_id)


@dataclass(frozen=True, slots=True)
class EventsRequest:
    filter: EventFilter
    max_results: int
    after: Cursor | None
    before: Cursor | None
    wait: float
    oldest_first: bool = False


@dataclass(frozen=True, slots=True)
class EventsReply:
    items: list[LogEntry]
    more: bool
    retention: Retention
    missed: str | None
    """Why items after `after` may be missing, or None."""

    def to_wire(self) -> dict[str, Any]:
        epoch = self.retention.epoch or ""
        empty = self.retention.oldest is None
        reply: dict[str, Any] = {
            "items": [
                {
                    "cursor": Cursor(epoch, entry.position).encode(),
                    "data": {"type": "change", "value": entry.item(epoch).to_wire()},
                }
                for entry in self.items
            ],
            "more": self.more,
            "oldest": "" if empty else Cursor(epoch, self.retention.oldest).encode(),  # type: ignore[arg-type]
            "newest": "" if empty else Cursor(epoch, self.retention.head).encode(),
            "missed": self.missed is not None,
        }
        if self.missed is not None:
            reply["missed_reason"] = self.missed
        return reply


# --- parsing: the query string and JSON-RPC params give the same EventsRequest ---------------


def parse_duration(name: str, value: Any) -> float:
    """Seconds from a number of seconds or a string such as ``"500ms"``, ``"5s"``, ``"1m"``."""
    if isinstance(value, bool):
        raise ParamError(f"{name} must be a number of seconds or a duration such as '5s'")
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(value) if isinstance(value, str) else None
    if match is None:
        raise ParamError(f"{name} must be a number of seconds or a duration such as '5s'")
    number, unit = float(match.group(1)), match.group(2) or "s"
    return number * {"ms": 0.001, "s": 1.0, "m": 60.0}[unit]


def _cursor(name: str, value: Any) -> Cursor | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ParamError(f"{name} must be a cursor string")
    try:
        return Cursor.decode(value)
    except CursorError as exc:
        raise ParamError(f"{name}: {exc}") from None


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ParamError(f"{name} must be an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    raise ParamError(f"{name} must be an integer")


def _filter(
    resource: Any, subs: Any, ids: Any, prefixes: Any, resources: Mapping[str, Resource], where: str
) -> EventFilter:
    if resource is None or resource == "":
        if subs:
            raise ParamError(f"{where}subResources needs {where}resource")
        name = None
    elif not isinstance(resource, str) or resource not in resources:
        known = ", ".join(sorted(resources))
        raise ParamError(f"{where}resource: unknown resource {resource!r} (known: {known})")
    else:
        name = resource
    sub_set: frozenset[str] = frozenset()
    if subs:
        if not isinstance(subs, list) or not all(isinstance(s, str) for s in subs):
            raise ParamError(f"{where}subResources must be a list of strings")
        assert name is not None
        known_subs = resources[name].sub_resources
        for sub in subs:
            if sub != WILDCARD and sub not in known_subs:
                raise ParamError(
                    f"{where}subResources: unknown sub-resource {sub!r} of {name!r} "
                    f"(known: {', '.join(known_subs)}, or '*')"
                )
        sub_set = frozenset() if WILDCARD in subs else frozenset(subs)
    try:
        watch = parse_watch(ids, prefixes, where)
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
    limits: Limits,
) -> EventsRequest:
    count = limits.results if max_results is None else _int("max_results", max_results)
    if count <= 0:
        count = limits.results  # the ADR: zero or negative asks for the default
    wait = limits.wait if wait_time is None else parse_duration("wait_time", wait_time)
    if wait <= 0:
        wait = limits.wait  # the ADR: zero or negative waits a default interval
    if order not in (None, "newest", "oldest"):
        raise ParamError("order must be 'newest' (the default) or 'oldest'")
    return EventsRequest(
        filter,
        min(count, limits.max_results),
        _cursor("after", after),
        _cursor("before", before),
        min(wait, limits.max_wait),
        order == "oldest",
    )


QUERY_PARAMETERS = ("resource", "sub", "id", "prefix", "max_results", "after", "before",
                    "wait_time", "order")


def from_query(
    query: Mapping[str, str], getall: Any, resources: Mapping[str, Resource], limits: Limits
) -> EventsRequest:
    """The request of `GET /changefeeds/events?...` (`getall(name)` lists a repeated parameter)."""
    unknown = sorted(set(query) - set(QUERY_PARAMETERS))
    if unknown:
        raise ParamError(
            f"unknown parameter(s) {', '.join(unknown)} (known: {', '.join(QUERY_PARAMETERS)})"
        )
    for single in ("resource", "max_results", "after", "before", "wait_time", "order"):
        if len(getall(single)) > 1:
            raise ParamError(f"{single} given more than once")
    filter = _filter(
        query.get("resource"),
        getall("sub") or None,
        getall("id") or None,
        getall("prefix") or None,
        resources,
        "",
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


PARAMS = ("filter", "max_results", "after", "before", "wait_time", "order")
FILTER_KEYS = ("resource", "subResources", "ids", "prefixes")


def from_params(
    params: Any, resources: Mapping[str, Resource], limits: Limits
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
    filter = _filter(
        spec.get("resource"),
        spec.get("subResources"),
        spec.get("ids"),
        spec.get("prefixes"),
        resources,
        "filter.",
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


# --- answering -----------------------------------------------------------------------------


def select(
    entries: Sequence[LogEntry], filter: EventFilter, wanted: int, found: list[LogEntry]
) -> bool:
    """Append matching `entries` to `found` up to `wanted`; True when one more matched (`more`)."""
    for entry in entries:
        if filter.matches(entry):
            if len(found) == wanted:
                return True
            found.append(entry)
    return False


async def scan(
    bucket: ChangeBucket,
    request: EventsRequest,
    after: StreamId | None,
    before: StreamId | None,
) -> tuple[list[LogEntry], bool]:
    """The eligible items in (after, before) in the request's order, and `more`."""
    found: list[LogEntry] = []
    if request.oldest_first:
        position = after or StreamId(0, 0)
        while True:
            entries = await bucket.read(position, None, SCAN)
            if before is not None:
                entries = [e for e in entries if e.position < before]
            if select(entries, request.filter, request.max_results, found):
                return found, True
            if len(entries) < SCAN:
                return found, False
            position = entries[-1].position
    upper = before
    while True:
        entries = await bucket.read_newest(upper, after, SCAN)
        if select(entries, request.filter, request.max_results, found):
            return found, True
        if len(entries) < SCAN:
            return found, False
        upper = entries[-1].position


async def answer(bucket: ChangeBucket, hub: Hub, request: EventsRequest) -> EventsReply:
    """Run one `events` request: scan, and wait for new items when the ADR says so."""
    loop_time = asyncio.get_running_loop().time
    deadline = loop_time() + request.wait
    retention = await bucket.retention()
    epoch = retention.epoch
    missed = None
    after = request.after.position if request.after else None
    before = request.before.position if request.before else None
    for cursor in (request.after, request.before):
        if cursor is not None and cursor.epoch != epoch:
            missed = "the cursor is of another bucket epoch (the bucket was recreated)"
            after = before = None
    if missed is None and after is not None and after < retention.trimmed:
        missed = "after is older than the retained log: items after it were trimmed"
    floor = after
    while True:
        items, more = await scan(bucket, request, floor, before)
        if items or before is not None:
            break
        remaining = deadline - loop_time()
        if remaining <= 0:
            break
        # Nothing eligible up to this head: wait for the tail to read past it, then look only
        # at what is newer (no busy polling: one shared event).
        floor = max(floor or retention.head, retention.head)
        if not await hub.wait_past(floor, remaining):
            break
        retention = await bucket.retention()
        if retention.epoch != epoch:
            missed = "the bucket was recreated while waiting"
            items, more = [], False
            break
    if items and max(items[0].position, items[-1].position) > retention.head:
        retention = await bucket.retention()  # `newest` must not be older than an item
    return EventsReply(items, more, retention, missed)


__all__ = ["EventFilter", "EventsReply", "EventsRequest", "ParamError", "answer", "from_params",
           "from_query", "parse_duration"]
