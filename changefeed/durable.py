"""The wire format of durable pull consumers (in the manner of JetStream's durable consumers),
spoken by the publisher's routes and the listener's `DurableConsumer`.

A durable consumer is a name on the publisher whose position is kept in Redis and advanced only
by acknowledgements. Its configuration is fixed when it is created:

    ConsumerConfig     filter, ack_wait, max_deliver, max_ack_pending, start  (from_wire / to_wire)

and each item handed out is a *delivery*, named by a `DeliveryId` (the consumer's incarnation,
the item's log position and the delivery's number). The routes (docs/pull.md#durable-consumers):

    PUT    /changefeeds/durable/<name>             create (ConsumerConfig)        -> info
    GET    /changefeeds/durable/<name>             info
    DELETE /changefeeds/durable/<name>             delete
    POST   /changefeeds/durable/<name>/fetch       FetchRequest                   -> FetchReply
    POST   /changefeeds/durable/<name>/ack         SettleRequest (also nak, in_progress, term)
                                                                                  -> SettleReply
    GET    /changefeeds/durable/<name>/dead        the dead-letter record

Every settlement says truthfully whether it took effect (`Outcome`). Pure code: no sockets, no
clocks, no Redis.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from changefeed import longpoll
from changefeed.cursor import Position
from changefeed.deliveries import Action, DeadReason, DeliveryId, Outcome, valid_incarnation
from changefeed.errors import CursorError, ParamError, ProtocolError
from changefeed.longpoll import EventFilter
from changefeed.protocol import ChangeItem, Resource, decode_item, json_object

DURABLE = "/changefeeds/durable"
"""The routes' common prefix: `DURABLE/<name>`, `DURABLE/<name>/fetch`, ..."""
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,50}$")
"""A durable consumer's name: 1 to 50 letters, digits, '_', '.' or '-'."""

FIRST = "first"
"""`start`: from the oldest item the log retains when the consumer is created."""
LAST = "last"
"""`start`: only items committed after the consumer is created."""

DEFAULT_ACK_WAIT = 30.0
"""Seconds a delivery may stay unacknowledged before the item is handed out again."""
MIN_ACK_WAIT = 0.05
DEFAULT_MAX_DELIVER = 5
"""Deliveries of one item before it goes to the dead-letter record."""
MAX_DELIVER = 1000
DEFAULT_MAX_ACK_PENDING = 1000
"""Items handed out and not yet settled, at most, per consumer (new items wait beyond it)."""

CONFIG_KEYS = ("filter", "ack_wait", "max_deliver", "max_ack_pending", "start")
FETCH_KEYS = ("max_messages", "wait_time", "instance")
SETTLE_KEYS = ("deliveries", "delay")
FILTER_KEYS = longpoll.FILTER_KEYS


class _NoLimits:
    """`longpoll.from_params` needs limits; only the filter is taken from it."""

    results = max_results = 1
    wait = max_wait = 1.0


# --- configuration ---------------------------------------------------------------------------


def filter_to_wire(filter: EventFilter) -> dict[str, Any]:
    """The filter as the JSON-RPC `events` call spells it, leaving out what is empty."""
    wire: dict[str, Any] = {}
    if filter.resource is not None:
        wire["resource"] = filter.resource
    if filter.sub_resources:
        wire["subResources"] = sorted(filter.sub_resources)
    wire.update(filter.watch.to_wire())
    return wire


def parse_filter(spec: Any, resources: Mapping[str, Resource]) -> EventFilter:
    """A filter object (`events`' JSON-RPC `filter`: resource, subResources, ids, prefixes),
    checked against the publisher's resources. Raises ParamError naming the key."""
    return longpoll.from_params({"filter": spec}, resources, _NoLimits()).filter


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """A durable consumer's configuration, fixed when it is created.

    `start` is where a new consumer begins: `FIRST` (the oldest retained item), `LAST` (items
    committed after its creation) or a cursor (the items after it).
    """

    filter: EventFilter = field(default_factory=EventFilter)
    ack_wait: float = DEFAULT_ACK_WAIT
    max_deliver: int = DEFAULT_MAX_DELIVER
    max_ack_pending: int = DEFAULT_MAX_ACK_PENDING
    start: str = FIRST

    def to_wire(self) -> dict[str, Any]:
        return {
            "filter": filter_to_wire(self.filter),
            "ack_wait": self.ack_wait,
            "max_deliver": self.max_deliver,
            "max_ack_pending": self.max_ack_pending,
            "start": self.start,
        }

    def encode(self) -> bytes:
        """The canonical JSON stored in Redis: equal configurations encode equally."""
        return orjson.dumps(self.to_wire(), option=orjson.OPT_SORT_KEYS)

    def differences(self, other: ConsumerConfig) -> list[str]:
        """What differs from `other`, one phrase per key: `ack_wait is 30.0, not 10.0`."""
        mine, theirs = self.to_wire(), other.to_wire()
        return [
            f"{key} is {orjson.dumps(mine[key]).decode()}, not {orjson.dumps(theirs[key]).decode()}"
            for key in CONFIG_KEYS
            if mine[key] != theirs[key]
        ]


def _seconds(name: str, value: Any, lowest: float, highest: float) -> float:
    seconds = longpoll.parse_duration(name, value)
    if not (math.isfinite(seconds) and lowest <= seconds <= highest):
        raise ParamError(f"{name} must be from {lowest:g} to {highest:g} seconds, not {value!r}")
    return seconds


def _count(name: str, value: Any, highest: int) -> int:
    number = longpoll.parse_int(name, value)
    if not 1 <= number <= highest:
        raise ParamError(f"{name} must be an integer from 1 to {highest}, not {number}")
    return number


def parse_config(
    body: Any,
    resources: Mapping[str, Resource],
    *,
    max_ack_wait: float,
    max_ack_pending: int,
) -> ConsumerConfig:
    """A consumer's configuration from a create request's JSON body (an object; absent keys
    take their defaults), within the publisher's bounds. Raises ParamError naming the key."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise ParamError("the body must be a JSON object")
    unknown = sorted(set(body) - set(CONFIG_KEYS))
    if unknown:
        raise ParamError(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(CONFIG_KEYS)})")
    filter = parse_filter(body.get("filter"), resources)
    ack_wait = DEFAULT_ACK_WAIT if body.get("ack_wait") is None else _seconds(
        "ack_wait", body["ack_wait"], MIN_ACK_WAIT, max_ack_wait
    )
    if ack_wait > max_ack_wait:
        raise ParamError(f"ack_wait must be at most {max_ack_wait:g} seconds (durable.maxAckWait)")
    max_deliver = DEFAULT_MAX_DELIVER if body.get("max_deliver") is None else _count(
        "max_deliver", body["max_deliver"], MAX_DELIVER
    )
    pending = min(DEFAULT_MAX_ACK_PENDING, max_ack_pending)
    if body.get("max_ack_pending") is not None:
        pending = _count("max_ack_pending", body["max_ack_pending"], max_ack_pending)
    start = body.get("start", FIRST)
    if start is None:
        start = FIRST
    if not isinstance(start, str):
        raise ParamError(f"start must be '{FIRST}', '{LAST}' or a cursor")
    if start not in (FIRST, LAST):
        try:
            Position.decode_single(start)
        except CursorError as exc:
            raise ParamError(f"start must be '{FIRST}', '{LAST}' or a cursor: {exc}") from None
    return ConsumerConfig(filter, ack_wait, max_deliver, pending, start)


def stored_config(text: bytes | str, resources: Mapping[str, Resource]) -> ConsumerConfig:
    """A configuration as `ConsumerConfig.encode` stored it (bounds were checked at creation)."""
    wire = orjson.loads(text)
    return ConsumerConfig(
        parse_filter(wire["filter"], resources),
        float(wire["ack_wait"]),
        int(wire["max_deliver"]),
        int(wire["max_ack_pending"]),
        str(wire["start"]),
    )


# --- deliveries (DeliveryId, Action, Outcome, DeadReason: changefeed.deliveries) ------------


@dataclass(frozen=True, slots=True)
class Message:
    """An item handed out by a durable consumer: the change item, its delivery and how many
    times it has been handed out (1 the first time)."""

    item: ChangeItem
    delivery: str
    deliveries: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "delivery": self.delivery,
            "deliveries": self.deliveries,
            "cursor": self.item.cursor,
            "data": {"type": "change", "value": self.item.to_wire()},
        }


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """Up to `max_messages` messages, waiting up to `wait` seconds for the first (0: answer at
    once). `instance` names the asking instance in the consumer's records (optional)."""

    max_messages: int
    wait: float
    instance: str = ""

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"max_messages": self.max_messages, "wait_time": self.wait}
        if self.instance:
            wire["instance"] = self.instance
        return wire


def parse_fetch(body: Any, limits: longpoll.PollLimits) -> FetchRequest:
    """A fetch request's JSON body. `max_messages` absent: `limits.results`, capped at
    `limits.max_results`; `wait_time` by `longpoll.parse_wait` (absent: `limits.wait`; 0
    answers at once; negative refused; capped at `limits.max_wait`)."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise ParamError("the body must be a JSON object")
    unknown = sorted(set(body) - set(FETCH_KEYS))
    if unknown:
        raise ParamError(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(FETCH_KEYS)})")
    count = limits.results
    if body.get("max_messages") is not None:
        count = longpoll.parse_int("max_messages", body["max_messages"])
        if count < 1:
            raise ParamError(f"max_messages must be 1 or more, not {count}")
    wait = longpoll.parse_wait("wait_time", body.get("wait_time"), limits)
    instance = body.get("instance") or ""
    if not isinstance(instance, str) or len(instance) > 200 or not instance.isprintable():
        raise ParamError("instance must be a printable string of at most 200 characters")
    return FetchRequest(min(count, limits.max_results), wait, instance)


@dataclass(frozen=True, slots=True)
class FetchReply:
    """A fetch's answer: the messages (redeliveries first, then new items in log order), how
    many items are handed out and unsettled, and how many records this fetch added to the
    dead-letter record (items past `max_deliver`, trimmed gaps)."""

    messages: tuple[Message, ...]
    pending: int
    dead_lettered: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {
            "messages": [message.to_wire() for message in self.messages],
            "pending": self.pending,
            "dead_lettered": self.dead_lettered,
        }

    @classmethod
    def parse(cls, body: bytes | str) -> FetchReply:
        """Raises ProtocolError when `body` is not a fetch reply."""
        reply = json_object(body, "fetch reply")
        messages = reply.get("messages")
        if not isinstance(messages, list):
            raise ProtocolError(f"fetch reply without messages: {body!r:.200}")
        out = []
        for entry in messages:
            try:
                value = entry["data"]["value"]
                delivery, deliveries = entry["delivery"], entry["deliveries"]
                if not isinstance(delivery, str) or not isinstance(deliveries, int):
                    raise TypeError
                item = decode_item(value)
            except (KeyError, TypeError):
                raise ProtocolError(f"fetch reply holds a bad message: {entry!r:.200}") from None
            if not item.cursor:
                raise ProtocolError(f"fetch reply holds a message without cursor: {entry!r:.200}")
            out.append(Message(item, delivery, deliveries))
        return cls(tuple(out), _int(reply, "pending"), _int(reply, "dead_lettered"))


# --- settling: ack, nak, in_progress, term -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class SettleRequest:
    """Settle `deliveries` with one action; `delay` (seconds) is nak's wait before redelivery."""

    deliveries: tuple[DeliveryId, ...]
    delay: float = 0.0

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"deliveries": [d.encode() for d in self.deliveries]}
        if self.delay:
            wire["delay"] = self.delay
        return wire


def parse_settle(body: Any, action: Action, *, most: int, max_delay: float) -> SettleRequest:
    """A settlement's JSON body: `{"deliveries": [...], "delay": seconds}` (`delay` for nak
    only, 0 to `max_delay`). At most `most` deliveries per request."""
    if not isinstance(body, dict):
        raise ParamError("the body must be a JSON object with deliveries")
    unknown = sorted(set(body) - set(SETTLE_KEYS))
    if unknown:
        raise ParamError(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(SETTLE_KEYS)})")
    given = body.get("deliveries")
    if not isinstance(given, list) or not given:
        raise ParamError("deliveries must be a non-empty list of delivery ids")
    if len(given) > most:
        raise ParamError(f"deliveries names {len(given)} deliveries: at most {most} per request")
    deliveries = tuple(DeliveryId.decode(text) for text in given)
    delay = 0.0
    if body.get("delay") is not None:
        if action is not Action.NAK:
            raise ParamError(f"delay applies to nak only, not {action.value}")
        delay = _seconds("delay", body["delay"], 0.0, max_delay)
    return SettleRequest(deliveries, delay)


@dataclass(frozen=True, slots=True)
class Settled:
    """What one settlement did: `outcome`, and `late` when the ack wait had passed (the item
    could have been handed out again; it had not been)."""

    delivery: str
    outcome: Outcome
    late: bool = False

    @property
    def applied(self) -> bool:
        return self.outcome is Outcome.APPLIED

    def to_wire(self) -> dict[str, Any]:
        return {"delivery": self.delivery, "applied": self.applied,
                "outcome": self.outcome.value, "late": self.late}


@dataclass(frozen=True, slots=True)
class SettleReply:
    results: tuple[Settled, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"results": [result.to_wire() for result in self.results]}

    @classmethod
    def parse(cls, body: bytes | str) -> SettleReply:
        reply = json_object(body, "settle reply")
        results = reply.get("results")
        if not isinstance(results, list):
            raise ProtocolError(f"settle reply without results: {body!r:.200}")
        out = []
        for entry in results:
            try:
                out.append(Settled(str(entry["delivery"]), Outcome(entry["outcome"]),
                                   entry.get("late") is True))
            except (KeyError, TypeError, ValueError):
                raise ProtocolError(f"settle reply holds a bad result: {entry!r:.200}") from None
        return cls(tuple(out))


# --- helpers ---------------------------------------------------------------------------------


def _int(reply: Mapping[str, Any], key: str) -> int:
    value = reply.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


__all__ = [
    "CONFIG_KEYS",
    "DEFAULT_ACK_WAIT",
    "DEFAULT_MAX_ACK_PENDING",
    "DEFAULT_MAX_DELIVER",
    "DURABLE",
    "FIRST",
    "LAST",
    "MAX_DELIVER",
    "MIN_ACK_WAIT",
    "NAME",
    "Action",
    "ConsumerConfig",
    "DeadReason",
    "DeliveryId",
    "FetchReply",
    "FetchRequest",
    "Message",
    "Outcome",
    "SettleReply",
    "SettleRequest",
    "Settled",
    "filter_to_wire",
    "parse_config",
    "parse_fetch",
    "parse_filter",
    "parse_settle",
    "stored_config",
    "valid_incarnation",
]
