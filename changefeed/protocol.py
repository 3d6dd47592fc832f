"""The change-feed wire protocol, shared by the publisher and the listener.

Compatible with Joyent's node-sdc-changefeed 1.5 listeners (RFD 5), plus optional extensions that
old listeners ignore (`since`, `cursor`, `resumed`, `published`, `"*"` sub-resources, and watches:
`ids` and `prefixes` in a change kind).

Pure code: no sockets, no clocks. See docs/protocol.md for the prose version.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import orjson

from changefeed.errors import ProtocolError, RegistrationError
from changefeed.watch import EVERYTHING, Watch, parse_watch

CHANGEFEEDS = "/changefeeds"
"""The route of the websocket registration, `GET /changefeeds` and the routes under it."""

HEARTBEAT = "heartbeat"
"""The text frame Triton listeners send every ~28 s after registering; ignored."""

WILDCARD = "*"
"""A sub-resource in a registration that matches every item of its resource."""

MAX_REASON_BYTES = 123
"""RFC 6455 limits a close reason to 123 bytes of UTF-8."""


class CloseCode(IntEnum):
    """Every websocket close code of the change feed: those the publisher sends, and those a
    listener sees without a close frame (documented in docs/protocol.md, checked by a test).
    The one home of close codes: the publisher and the listener name them by this enum."""

    NORMAL = 1000
    GOING_AWAY = 1001  # publisher shutting down, or a missing pong
    PROTOCOL_ERROR = 1002  # a frame that breaks RFC 6455 (an unmasked one)
    UNSUPPORTED_DATA = 1003  # a binary frame where text was expected
    NO_STATUS = 1005  # not on the wire: a close frame without a code
    ABNORMAL_CLOSURE = 1006  # not on the wire: the connection ended without a close frame
    INVALID_DATA = 1007  # a text frame that is not UTF-8
    POLICY_VIOLATION = 1008  # invalid registration; the reason says what was wrong
    MESSAGE_TOO_BIG = 1009  # a frame over the registration size limit
    INTERNAL_ERROR = 1011  # an unexpected publisher fault; reconnect
    TRY_AGAIN_LATER = 1013  # the bucket (Redis) is unreachable; reconnect with backoff
    SLOW_CONSUMER = 4008  # fell behind the publisher's window; reconnect with `since`
    BUCKET_RESET = 4009  # the bucket was recreated (new epoch); reconnect and bootstrap
    OVERLOADED = 4029  # the publisher had no Redis connection free in time; reconnect with backoff


@dataclass(frozen=True, slots=True)
class Resource:
    """A resource the publisher serves: its sub-resources and its bootstrap route."""

    resource: str
    sub_resources: tuple[str, ...]
    bootstrap_route: str

    def to_wire(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "subResources": list(self.sub_resources),
            "bootstrapRoute": self.bootstrap_route,
        }


@dataclass(frozen=True, slots=True)
class ChangeKind:
    """What a registration listens for: one resource, some of its sub-resources and, optionally,
    only some of its ids (a watch on exact ids and id prefixes)."""

    resource: str
    sub_resources: tuple[str, ...]
    watch: Watch = EVERYTHING
    _subs: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_subs", frozenset(self.sub_resources))

    def to_wire(self) -> dict[str, Any]:
        """The change kind of a registration: `ids` and `prefixes` only when it has a watch."""
        return {
            "resource": self.resource,
            "subResources": list(self.sub_resources),
            **self.watch.to_wire(),
        }

    def matches(self, sub_resources: Iterable[str]) -> bool:
        """True when an item of this resource with `sub_resources` is for this kind's
        sub-resources (whatever its id)."""
        return WILDCARD in self._subs or not self._subs.isdisjoint(sub_resources)

    def matches_item(self, sub_resources: Iterable[str], changed_resource_id: str) -> bool:
        """True when an item of this resource with `sub_resources` and `changed_resource_id`
        is for this kind: its sub-resources and its watch."""
        return self.matches(sub_resources) and self.watch.matches(changed_resource_id)


@dataclass(frozen=True, slots=True)
class Registration:
    """A listener's registration, as sent in its first websocket frame."""

    instance: str
    service: str
    kinds: tuple[ChangeKind, ...]
    version: int
    since: str | None = None
    coalesce: bool = False
    """Asks that a slow listener be sent a coalesced catch-up instead of being closed with
    4008 (docs/protocol.md#coalesced-catch-up). Triton's listeners never send it."""

    def to_wire(self) -> dict[str, Any]:
        """The registration frame a listener sends (v1 for one kind, else v2)."""
        frame: dict[str, Any] = {"instance": self.instance, "service": self.service}
        if self.version == 1:
            frame["changeKind"] = self.kinds[0].to_wire()
        else:
            frame["resources"] = [kind.to_wire() for kind in self.kinds]
        if self.since is not None:
            frame["since"] = self.since
        if self.coalesce:
            frame["coalesce"] = True
        return frame


@dataclass(frozen=True, slots=True)
class ChangeItem:
    """One change item as listeners receive it."""

    resource: str
    sub_resources: tuple[str, ...]
    changed_resource_id: str
    published: int
    """Milliseconds since the Unix epoch, as the bucket recorded it."""
    cursor: str
    coalesced: bool = False
    """Sent in a coalesced catch-up: it stands for every change of its id while the listener
    was behind (sub-resources merged, the newest cursor). Its cursor is not a resume point,
    except on the last item of the catch-up (`caught_up`)."""
    caught_up: bool = False
    """The last item of a coalesced catch-up: the listener is live again after it, and
    nothing up to its cursor is missing."""

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "changeKind": {"resource": self.resource, "subResources": list(self.sub_resources)},
            "changedResourceId": self.changed_resource_id,
            "published": str(self.published),
            "cursor": self.cursor,
        }
        if self.coalesced:
            wire["coalesced"] = True
            if self.caught_up:
                wire["caughtUp"] = True
        return wire

    def encode(self) -> bytes:
        return orjson.dumps(self.to_wire())


def accept_version(header: str | None) -> int:
    """The registration version a listener asks for with its `Accept-Version` header.

    `~1`, `1`, `1.x` or no header mean v1 (node-sdc-changefeed listeners before 1.5 send none);
    `~2`/`2`/`2.x` mean v2. Anything else raises RegistrationError (sent as HTTP 400).
    """
    if header is None or not header.strip() or header.strip() == "*":
        return 1
    text = header.strip().lstrip("~^=v").split(".", 1)[0]
    if text in ("1", "2"):
        return int(text)
    raise RegistrationError(
        CloseCode.POLICY_VIOLATION,
        f"unsupported Accept-Version {header!r}: this publisher speaks ~1 and ~2",
    )


def _refuse(reason: str) -> RegistrationError:
    return RegistrationError(CloseCode.POLICY_VIOLATION, reason)


def _parse_kind(value: Any, where: str, resources: Mapping[str, Resource]) -> ChangeKind:
    if not isinstance(value, dict):
        raise _refuse(f"{where} must be an object with resource and subResources")
    name = value.get("resource")
    if not isinstance(name, str):
        raise _refuse(f"{where}.resource must be a string")
    resource = resources.get(name)
    if resource is None:
        known = ", ".join(sorted(resources)) or "none"
        raise _refuse(f"unknown resource {name!r} in {where} (known: {known})")
    subs = value.get("subResources")
    if not isinstance(subs, list) or not subs or not all(isinstance(s, str) for s in subs):
        raise _refuse(f"{where}.subResources must be a non-empty list of strings")
    for sub in subs:
        if sub != WILDCARD and sub not in resource.sub_resources:
            raise _refuse(
                f"unknown sub-resource {sub!r} of {name!r} "
                f"(known: {', '.join(resource.sub_resources)}, or '*')"
            )
    try:
        watch = parse_watch(value.get("ids"), value.get("prefixes"), f"{where}.")
    except ValueError as exc:
        raise _refuse(str(exc)) from None
    return _interned(ChangeKind(name, tuple(dict.fromkeys(subs)), watch))


_KINDS: dict[ChangeKind, ChangeKind] = {}
KINDS_INTERNED = 4096
"""Distinct change kinds kept to be shared; past this many, new ones are not interned (the
registrations come from strangers: the cache must stay bounded)."""


def _interned(kind: ChangeKind) -> ChangeKind:
    """One object per distinct change kind: the thousands of listeners that register the same
    kinds share them (with their sub-resource set and watch) instead of each holding a copy."""
    found = _KINDS.get(kind)
    if found is not None:
        return found
    if len(_KINDS) < KINDS_INTERNED:
        _KINDS[kind] = kind
    return kind


def parse_registration(
    text: str | bytes, version: int, resources: Mapping[str, Resource]
) -> Registration:
    """Validate a registration frame against the configured resources.

    Raises RegistrationError with close code 1008 and a reason naming what was wrong.
    """
    try:
        frame = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise _refuse("registration is not valid JSON") from None
    if not isinstance(frame, dict):
        raise _refuse("registration must be a JSON object")
    instance = frame.get("instance")
    if not isinstance(instance, str) or not instance:
        raise _refuse("registration needs instance: a non-empty string")
    service = frame.get("service", "")
    if not isinstance(service, str):
        raise _refuse("registration service must be a string")
    since = frame.get("since")
    if since is not None and not isinstance(since, str):
        raise _refuse("registration since must be a cursor string")
    coalesce = frame.get("coalesce", False)
    if not isinstance(coalesce, bool):
        raise _refuse(f"registration coalesce must be true or false, not {coalesce!r:.40}")
    if version == 1:
        if "changeKind" not in frame:
            raise _refuse("v1 registration (Accept-Version ~1) needs changeKind")
        kinds: tuple[ChangeKind, ...] = (_parse_kind(frame["changeKind"], "changeKind", resources),)
    else:
        listed = frame.get("resources")
        if not isinstance(listed, list):
            raise _refuse("v2 registration (Accept-Version ~2) needs resources: a list")
        if not listed:
            raise _refuse("registration resources is empty")
        kinds = tuple(
            _parse_kind(value, f"resources[{i}]", resources) for i, value in enumerate(listed)
        )
        names = [kind.resource for kind in kinds]
        if len(set(names)) != len(names):
            raise _refuse("registration lists a resource twice")
    return Registration(instance, service, kinds, version, since, coalesce)


def registration_reply(
    registration: Registration,
    resources: Mapping[str, Resource],
    cursor: str,
    resumed: bool,
) -> dict[str, Any]:
    """The publisher's reply to a registration, in the registration's version."""
    entries = [resources[kind.resource].to_wire() for kind in registration.kinds]
    reply: dict[str, Any] = (
        entries[0] if registration.version == 1 else {"bootstrapRoutes": entries}
    )
    reply["cursor"] = cursor
    reply["resumed"] = resumed
    if registration.coalesce:
        reply["coalesce"] = True  # granted: this publisher knows the flag
    return reply


def is_registration_reply(frame: Mapping[str, Any]) -> bool:
    """Listeners tell the reply from items by its bootstrapRoute(s) key."""
    return "bootstrapRoute" in frame or "bootstrapRoutes" in frame


def reply_routes(frame: Mapping[str, Any]) -> list[Resource]:
    """The resource entries of a registration reply (either version)."""
    entries: Sequence[Any] = frame.get("bootstrapRoutes", [frame])
    routes = []
    for entry in entries:
        try:
            routes.append(
                Resource(
                    str(entry["resource"]),
                    tuple(str(s) for s in entry.get("subResources", ())),
                    str(entry["bootstrapRoute"]),
                )
            )
        except (KeyError, TypeError):
            raise ProtocolError(f"malformed registration reply entry: {entry!r}") from None
    return routes


def json_object(text: str | bytes, what: str) -> dict[str, Any]:
    """`text` parsed as a JSON object; ProtocolError saying that `what` ("frame", "fetch
    reply") is not JSON, or not an object, otherwise."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise ProtocolError(f"{what} is not JSON: {text!r:.200}") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} is not a JSON object: {text!r:.200}")
    return value


def decode_item(frame: Mapping[str, Any]) -> ChangeItem:
    """Validate a change item received by a listener. Raises ProtocolError."""
    try:
        kind = frame["changeKind"]
        resource = kind["resource"]
        subs = kind["subResources"]
        changed = frame["changedResourceId"]
        if not (
            isinstance(resource, str)
            and isinstance(subs, list)
            and all(isinstance(s, str) for s in subs)
            and isinstance(changed, str)
        ):
            raise TypeError
        published = int(frame.get("published") or 0)
        cursor = frame.get("cursor") or ""
        coalesced = frame.get("coalesced", False)
        caught_up = frame.get("caughtUp", False)
        if not (
            isinstance(cursor, str) and isinstance(coalesced, bool)
            and isinstance(caught_up, bool)
        ):
            raise TypeError
    except (KeyError, TypeError, ValueError):
        raise ProtocolError(f"malformed change item: {dict(frame)!r:.200}") from None
    return ChangeItem(resource, tuple(subs), changed, published, cursor, coalesced,
                      coalesced and caught_up)


def close_reason(text: str) -> str:
    """`text` cut to fit a websocket close frame."""
    data = text.encode()
    if len(data) <= MAX_REASON_BYTES:
        return text
    return data[: MAX_REASON_BYTES - 3].decode(errors="ignore") + "..."


def text_frame(payload: bytes) -> bytes:
    """An unmasked, final websocket text frame (server to client) carrying `payload`.

    The fan-out builds it once per item and writes the same bytes to every matching connection.
    """
    length = len(payload)
    if length < 126:
        header = struct.pack("!BB", 0x81, length)
    elif length < 1 << 16:
        header = struct.pack("!BBH", 0x81, 126, length)
    else:
        header = struct.pack("!BBQ", 0x81, 127, length)
    return header + payload


def close_frame(code: int, reason: str) -> bytes:
    """A websocket close frame (server to client), for closing a connection whose writer is
    congested without waiting on it."""
    payload = struct.pack("!H", code) + close_reason(reason).encode()
    return struct.pack("!BB", 0x88, len(payload)) + payload
