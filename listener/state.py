"""The listener's state machine: pure code, no sockets, clocks or sleeps.

The I/O layer (`listener.client`) asks the core what to do and tells it what happened:

    attempt()                  -> where to connect and the registration frame to send
    reply(frame, now)          -> a Plan: resumed, or the Resync event and the routes to bootstrap
    item(frame)                -> the ChangeItem in a frame received after the reply (None for
                                  a heartbeat, or an item outside the watch)
    check_buffer(length)       -> raises BufferOverflow when the buffer holds too many items
    bootstrap_done(resource)   -> the BootstrapDone event (with the cursor on the last one)
    delivered(item)            -> the ChangeEvent; the cursor moves past the item
    failed(error, now)         -> the delay before the next attempt, or raises the fatal error

Phases: IDLE -> REGISTERING -> (BOOTSTRAPPING ->) STREAMING; any failure -> BACKING_OFF ->
REGISTERING on the next URL; a fatal failure -> CLOSED.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlencode, urljoin, urlsplit, urlunsplit

import orjson

from changefeed.backoff import Backoff
from changefeed.errors import (
    BufferOverflow,
    ChangefeedError,
    ConnectionLost,
    ProtocolError,
    RegistrationRejected,
)
from changefeed.protocol import (
    CHANGEFEEDS,
    HEARTBEAT,
    ChangeItem,
    ChangeKind,
    CloseCode,
    Registration,
    Resource,
    decode_item,
    is_registration_reply,
    json_object,
    reply_routes,
)
from changefeed.retry import Retrier
from changefeed.watch import EVERYTHING, Watch, parse_watch
from listener.events import BootstrapDone, ChangeEvent, Resync

REJECTIONS = frozenset({1002, CloseCode.UNSUPPORTED_DATA, 1007, CloseCode.POLICY_VIOLATION,
                        CloseCode.MESSAGE_TOO_BIG})
"""Close codes that answer a registration by refusing it: retrying would be refused again
(docs/protocol.md, "Close codes"), except for the two 1008 reasons below."""

SINCE_REFUSED = "since:"
"""The start of a 1008 reason refusing the `since` cursor: drop it and bootstrap."""
REGISTRATION_TIMEOUT = "no registration within"
"""The start of a 1008 reason for a registration that came too late: just reconnect."""



class Phase(enum.Enum):
    IDLE = "idle"
    REGISTERING = "registering"
    BOOTSTRAPPING = "bootstrapping"
    STREAMING = "streaming"
    BACKING_OFF = "backing off"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One connection attempt: the publisher's base URL, its websocket and what to send."""

    number: int
    url: str
    ws_url: str
    headers: Mapping[str, str]
    registration: Registration

    @property
    def frame(self) -> str:
        return orjson.dumps(self.registration.to_wire()).decode()


@dataclass(frozen=True, slots=True)
class Plan:
    """What follows a registration reply."""

    resumed: bool
    resync: Resync | None
    routes: tuple[Resource, ...]
    """The resources to bootstrap, in registration order (empty when resumed)."""
    cursor: str | None
    """The log head the publisher reported at registration."""
    coalesce: bool = False
    """The publisher granted a coalesced catch-up (it echoed `coalesce`)."""


def publisher_urls(url: str) -> tuple[str, str]:
    """(http base URL, websocket URL) of a publisher at http(s)://, ws(s):// or .../changefeeds."""
    parts = urlsplit(url.strip())
    schemes = {"http": "http", "ws": "http", "https": "https", "wss": "https"}
    if parts.scheme not in schemes or not parts.netloc:
        raise ValueError(f"publisher URL {url!r}: expected http://host:port (or ws://, https://)")
    path = parts.path.rstrip("/")
    if path.endswith(CHANGEFEEDS):
        path = path[: -len(CHANGEFEEDS)]
    base = urlunsplit((schemes[parts.scheme], parts.netloc, path, "", ""))
    ws_scheme = "wss" if schemes[parts.scheme] == "https" else "ws"
    return base, urlunsplit((ws_scheme, parts.netloc, path + CHANGEFEEDS, "", ""))


class ListenerCore:
    """Everything the listener decides, for publishers at `urls` and the kinds in `resources`."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        instance: str,
        service: str,
        resources: Mapping[str, Sequence[str]],
        watches: Mapping[str, Watch] | None = None,
        since: str | None = None,
        backoff: Backoff | None = None,
        healthy_after: float = 30.0,
        buffer_size: int = 10000,
        bootstrap: bool = True,
        coalesce: bool = False,
        rng: random.Random | None = None,
    ) -> None:
        listed = [urls] if isinstance(urls, str) else list(urls)
        if not listed:
            raise ValueError("a listener needs at least one publisher URL")
        self.urls = tuple(publisher_urls(url) for url in listed)
        if not instance:
            raise ValueError("a listener needs an instance id")
        if not resources:
            raise ValueError("a listener needs at least one resource")
        watches = watches or {}
        unknown = [name for name in watches if name not in resources]
        if unknown:
            raise ValueError(f"watches name resources not in resources: {', '.join(unknown)}")
        kinds = []
        for name, subs in resources.items():
            if isinstance(subs, str) or not subs:
                raise ValueError(f"resource {name!r}: sub-resources must be a non-empty list")
            kinds.append(ChangeKind(name, tuple(dict.fromkeys(subs)), _watch(name, watches)))
        self.kinds = tuple(kinds)
        self._kinds = {kind.resource: kind for kind in self.kinds}
        self.instance = instance
        self.service = service
        self.version = 1 if len(self.kinds) == 1 else 2
        self.retrier = Retrier(backoff or Backoff(), healthy_after=healthy_after, rng=rng)
        """The backoff delays, and the failure count that a healthy period starts again."""
        self.buffer_size = buffer_size
        self.bootstrap = bootstrap
        """False: stream changes only, never bootstrap (for `changefeed snoop`)."""
        self.coalesce = coalesce
        """Ask for a coalesced catch-up instead of 4008 when it falls behind."""
        self.phase = Phase.IDLE
        self.routes: dict[str, Resource] = {}
        """The resources of the last registration reply, by name."""
        self._cursor = since
        self._has_view = since is not None
        self._bootstrap_cursor: str | None = None
        self._pending: list[str] = []
        self._url_index = 0
        self._attempts = 0

    @property
    def cursor(self) -> str | None:
        """Where the application's view is: the listener resumes after it."""
        return self._cursor

    @property
    def failures(self) -> int:
        """Failed attempts in a row, since the last healthy period."""
        return self.retrier.failures

    @property
    def url(self) -> str:
        """The base URL of the publisher of the current (or next) attempt."""
        return self.urls[self._url_index][0]

    def attempt(self) -> Attempt:
        if self.phase not in (Phase.IDLE, Phase.BACKING_OFF):
            raise RuntimeError(f"cannot connect while {self.phase.value}")
        self.phase = Phase.REGISTERING
        self._attempts += 1
        base, ws_url = self.urls[self._url_index]
        registration = Registration(
            self.instance, self.service, self.kinds, self.version, self._cursor, self.coalesce
        )
        headers = {"Accept-Version": f"~{self.version}"}
        return Attempt(self._attempts, base, ws_url, headers, registration)

    def reply(self, text: str | bytes, now: float) -> Plan:
        """The registration reply arrived."""
        self._expect(Phase.REGISTERING)
        frame = json_object(text, "frame")
        if not is_registration_reply(frame):
            raise ProtocolError(f"expected a registration reply, got {text!r:.200}")
        routes = {resource.resource: resource for resource in reply_routes(frame)}
        missing = [kind.resource for kind in self.kinds if kind.resource not in routes]
        if missing:
            raise ProtocolError(f"registration reply lacks the resources {missing}")
        self.routes = routes
        cursor = frame.get("cursor")
        cursor = cursor if isinstance(cursor, str) and cursor else None
        granted = self.coalesce and frame.get("coalesce") is True
        if frame.get("resumed") is True and self._cursor is not None:
            self._streaming(now)
            return Plan(True, None, (), cursor, granted)
        resync = None
        if self._has_view:
            why = "no cursor to resume from" if self._cursor is None else (
                f"the publisher cannot resume after cursor {self._cursor}")
            resync = Resync(why)
        self._has_view = False
        self._cursor = None
        self._bootstrap_cursor = cursor
        if not self.bootstrap:
            self._has_view = True
            self._cursor = cursor
            self._streaming(now)
            return Plan(False, resync, (), cursor, granted)
        self._pending = [kind.resource for kind in self.kinds]
        self.phase = Phase.BOOTSTRAPPING
        return Plan(False, resync, tuple(routes[name] for name in self._pending), cursor,
                    granted)

    def route_url(self, resource: str) -> str:
        """The absolute URL of `resource`'s bootstrap route on the current publisher."""
        return urljoin(self.url + "/", self.routes[resource].bootstrap_route.lstrip("/"))

    def bootstrap_url(self, resource: str) -> str:
        """The URL to walk to bootstrap `resource`: its route, narrowed by the kind's watch with
        `id=` and `prefix=` parameters (docs/http.md). The pager adds its own parameters."""
        url = self.route_url(resource)
        query = self._kinds[resource].watch.to_query()
        if not query:
            return url
        return url + ("&" if "?" in url else "?") + urlencode(query)

    def bootstrap_done(self, resource: str, now: float) -> BootstrapDone:
        self._expect(Phase.BOOTSTRAPPING)
        self._pending.remove(resource)
        if self._pending:
            return BootstrapDone(resource)
        self._has_view = True
        self._cursor = self._bootstrap_cursor
        self._streaming(now)
        return BootstrapDone(resource, self._cursor)

    def item(self, text: str | bytes) -> ChangeItem | None:
        """The change item in a frame received after the reply: None for a heartbeat, and for an
        item outside the kind's watch (sent by a publisher that ignores watches)."""
        if text in (HEARTBEAT, HEARTBEAT.encode()):
            return None
        frame = json_object(text, "frame")
        if is_registration_reply(frame):
            raise ProtocolError("a second registration reply on one connection")
        item = decode_item(frame)
        kind = self._kinds.get(item.resource)
        if kind is None or not kind.matches(item.sub_resources):
            raise ProtocolError(
                f"change item of {item.resource} {list(item.sub_resources)}: not registered for it"
            )
        if not kind.watch.matches(item.changed_resource_id):
            return None  # from a publisher that does not know watches: filtered here instead
        return item

    def check_buffer(self, length: int) -> None:
        """The buffer now holds `length` items: abort when that is more than it may hold."""
        if length > self.buffer_size:
            raise BufferOverflow(self.buffer_size)

    def delivered(self, item: ChangeItem) -> ChangeEvent:
        """`item` goes to the application: the listener will resume after it. A coalesced item
        (docs/protocol.md#coalesced-catch-up) does not move the cursor, except the last one of
        its catch-up (`caught_up`): the ids still to come may have older changes before its
        cursor, which a resume from it would not send again."""
        self._expect(Phase.STREAMING)
        if item.cursor and (item.caught_up or not item.coalesced):
            self._cursor = item.cursor
        return ChangeEvent(item)

    def failed(self, error: ChangefeedError, now: float) -> float:
        """The current attempt failed: the seconds to wait before the next one.

        Raises RegistrationRejected when the publisher refused the registration, RetriesExhausted
        when the backoff's retry limit is reached, and `error` itself when it is not retryable
        (`changefeed.retry.is_retryable`). The backoff starts again from `initial` when the
        connection had been streaming for `healthy_after` seconds.
        """
        registering = self.phase is Phase.REGISTERING
        if self.phase is Phase.BOOTSTRAPPING:
            self._pending = []
        if (registering and isinstance(error, ConnectionLost)
                and error.close_code in REJECTIONS):
            if error.reason.startswith(SINCE_REFUSED) and self._cursor is not None:
                self._cursor = None  # a cursor the publisher cannot read: bootstrap
            elif not error.reason.startswith(REGISTRATION_TIMEOUT):
                self.phase = Phase.CLOSED
                raise RegistrationRejected(
                    error.url, error.close_code or 0, error.reason
                ) from error
        try:
            delay = self.retrier.failed(error, now)
        except BaseException:
            self.phase = Phase.CLOSED
            raise
        self._url_index = (self._url_index + 1) % len(self.urls)
        self.phase = Phase.BACKING_OFF
        return delay

    def _streaming(self, now: float) -> None:
        self.phase = Phase.STREAMING
        self.retrier.healthy(now)

    def _expect(self, phase: Phase) -> None:
        if self.phase is not phase:
            raise RuntimeError(f"listener is {self.phase.value}, expected {phase.value}")


def _watch(resource: str, watches: Mapping[str, Watch]) -> Watch:
    """The watch of `resource`, checked as the publisher will check it (ValueError if not)."""
    watch = watches.get(resource, EVERYTHING)
    if not isinstance(watch, Watch):
        raise ValueError(f"watches[{resource!r}]: expected a Watch, e.g. Watch.of(ids=[...])")
    return parse_watch(sorted(watch.ids), list(watch.prefixes), f"watches[{resource!r}].")


