"""The pull consumer's decisions (JetStream ADR-37 over the `events` long poll): pure code, no
sockets, clocks or sleeps. Times are numbers the I/O layer (`listener.consumer`) passes in.

    fetch_options(...), consume_options(...)  -> validated options (InvalidOption names one)
    Selection.of(...)                         -> what to pull: resource, subs, ids, prefixes
    Selection.query(pull)                     -> the query string of one `GET .../events`
    parse_reply(body)                         -> the items, `more`, `oldest`, `missed` of a reply

    FetchCore (one fetch or next)             ConsumeCore (one consume)
        pull(now)      -> Pull | None             pull(now)      -> Pull | None (None: not now)
        received(reply, now)                      received(reply, now)
        failed(error, now) -> delay | None        failed(error, now) -> delay | None
        heartbeat_deadline                        heartbeat_deadline
        result()       -> the items               take()         -> the next item, or None
                                                  stop(), drain(), finished

The ADR's pull request maps onto long polls: one `GET` waits at most `idle_heartbeat` seconds, and
its answer, empty or not, is the heartbeat (our server cannot send one in the middle of a poll).
An answer that does not come within twice `idle_heartbeat` is a missed heartbeat: reported, and
the consumer pulls again. `events` has no byte limit, so `max_bytes` is honoured on what the
consumer keeps: it asks for an estimate (the room left over the largest item seen), keeps the
items that fit and drops the rest, which the next pull asks for again.
"""

from __future__ import annotations

import enum
import math
import random
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from changefeed.backoff import Backoff
from changefeed.errors import (
    ChangefeedError,
    InvalidOption,
    ItemsMissed,
    ProtocolError,
    RetriesExhausted,
)
from changefeed.protocol import ChangeItem, decode_item
from changefeed.watch import EVERYTHING, Watch, parse_watch
from listener.state import is_retryable

DEFAULT_MAX_MESSAGES = 500
"""ADR-37: "probably between 100 and 1000"."""
BYTES_MODE_MAX_MESSAGES = 1_000_000
"""ADR-37: with `max_bytes`, the message limit is set to a large value internally."""
DEFAULT_EXPIRES = 30.0
MIN_EXPIRES = 1.0
MIN_HEARTBEAT = 0.5
MAX_HEARTBEAT = 30.0
MAX_RESULTS = 1000
"""The most items the publisher returns for one `events` request."""
MAX_WAIT = 60.0
"""The longest `wait_time` the publisher honours."""
ITEM_SIZE_GUESS = 256
"""Bytes per item assumed for a `max_bytes` pull before any item has been seen."""
SHORTEST_WAIT = 0.001
"""A fetch with less time than this left is over."""


def item_size(item: ChangeItem) -> int:
    """The size `max_bytes` counts: the bytes of the item as on the wire (its JSON)."""
    return len(item.encode())


# --- options --------------------------------------------------------------------------------


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


# --- requests and replies -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pull:
    """One `GET .../changefeeds/events`: the oldest items after `after`, at most `max_results`,
    waiting up to `wait_time` seconds for the first when there is none."""

    after: str | None
    max_results: int
    wait_time: float


@dataclass(frozen=True, slots=True)
class Selection:
    """What a consumer pulls: a resource (every one when None), some of its sub-resources (all
    when empty), and a watch on ids and id prefixes (every id when empty)."""

    resource: str | None = None
    sub_resources: tuple[str, ...] = ()
    watch: Watch = EVERYTHING

    @classmethod
    def of(
        cls,
        resource: str | None = None,
        sub_resources: Iterable[str] = (),
        ids: Iterable[str] = (),
        prefixes: Iterable[str] = (),
    ) -> Selection:
        """Validate the consumer's arguments; InvalidOption names the one at fault."""
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
        return cls(resource, subs, watch)

    def query(self, pull: Pull) -> list[tuple[str, str]]:
        """The query parameters of `pull` (order=oldest: forward, oldest first). The wait is
        sent in whole milliseconds and never as 0, which the publisher reads as its default."""
        params = [("order", "oldest"), ("max_results", str(pull.max_results)),
                  ("wait_time", f"{max(1, round(pull.wait_time * 1000))}ms")]
        if pull.after:
            params.append(("after", pull.after))
        if self.resource is not None:
            params.append(("resource", self.resource))
        params += [("sub", sub) for sub in self.sub_resources]
        return params + self.watch.to_query()


def _names(option: str, values: Iterable[str]) -> tuple[str, ...]:
    if isinstance(values, str):
        raise InvalidOption(option, values, "a list of strings, not one string")
    names = tuple(values)
    if not all(isinstance(name, str) and name for name in names):
        raise InvalidOption(option, list(names), "non-empty strings")
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True, slots=True)
class EventsReply:
    """A 200 answer of `events`. `more`: newer eligible items were left out (order=oldest)."""

    items: tuple[ChangeItem, ...]
    more: bool
    oldest: str
    newest: str
    missed: bool
    missed_reason: str = ""


def parse_reply(body: bytes | str) -> EventsReply:
    """Read an `events` answer. Raises ProtocolError when it is not of the documented form."""
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
            raise ProtocolError(f"events reply holds an entry that is not a change: {entry!r:.200}")
        item = decode_item(data["value"])
        cursor = entry.get("cursor")
        if not item.cursor and isinstance(cursor, str):
            item = ChangeItem(item.resource, item.sub_resources, item.changed_resource_id,
                              item.published, cursor)
        if not item.cursor:
            raise ProtocolError(f"events reply holds an item without a cursor: {entry!r:.200}")
        items.append(item)
    return EventsReply(
        tuple(items),
        reply.get("more") is True,
        _text(reply, "oldest"),
        _text(reply, "newest"),
        reply.get("missed") is True,
        _text(reply, "missed_reason"),
    )


def _text(reply: dict[str, Any], key: str) -> str:
    value = reply.get(key)
    return value if isinstance(value, str) else ""


# --- the parts every pull shares --------------------------------------------------------------


class Batch:
    """Items held against one limit, `max_messages` or `max_bytes`, in cursor order.

    With `max_bytes` the batch keeps at least one item (one bigger than the limit would stall
    the consumer for ever otherwise), and remembers the size of the first item it had to drop:
    no pull is worth making until there is room for it.
    """

    def __init__(self, max_messages: int | None, max_bytes: int | None) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: deque[tuple[ChangeItem, int]] = deque()
        self._largest = 0
        self._blocked_by: int | None = None
        """Size of the next item, known because it did not fit."""

    def __len__(self) -> int:
        return len(self._items)

    @property
    def full(self) -> bool:
        return self.wanted() == 0

    def wanted(self) -> int:
        """How many items to ask for so that the batch fills (an estimate with max_bytes)."""
        if self.max_bytes is None:
            assert self.max_messages is not None
            return max(0, min(self.max_messages - len(self._items), MAX_RESULTS))
        room = self.max_bytes - self.bytes
        if self._items and (room <= 0 or (self._blocked_by or 0) > room):
            return 0
        return max(1, min(room // (self._largest or ITEM_SIZE_GUESS), MAX_RESULTS))

    def add(self, items: Sequence[ChangeItem]) -> int:
        """Keep what fits of `items`, in order; returns how many were kept."""
        kept = 0
        for item in items:
            size = item_size(item)
            if self.max_bytes is None:
                assert self.max_messages is not None
                fits = len(self._items) < self.max_messages
            else:
                fits = not self._items or self.bytes + size <= self.max_bytes
            if not fits:
                self._blocked_by = size
                break
            self._items.append((item, size))
            self.bytes += size
            self._largest = max(self._largest, size)
            self._blocked_by = None
            kept += 1
        return kept

    def pop(self) -> ChangeItem | None:
        if not self._items:
            return None
        item, size = self._items.popleft()
        self.bytes -= size
        return item

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0
        self._blocked_by = None

    def __iter__(self) -> Iterator[ChangeItem]:
        return (item for item, _ in self._items)


class Retrier:
    """Which failures are retried, and after how long (the backoff's delays)."""

    def __init__(self, backoff: Backoff, rng: random.Random | None = None) -> None:
        self.backoff = backoff
        self.failures = 0
        """Failed requests since the last answer."""
        self._rng = rng or random.Random()
        self._delays = backoff.delays(self._rng)

    def failed(self, error: ChangefeedError) -> float:
        """The delay before the next request; raises `error` when it is not retryable, and
        RetriesExhausted when the backoff's retry limit is reached."""
        if not is_retryable(error):
            raise error
        self.failures += 1
        delay = next(self._delays, None)
        if delay is None:
            raise RetriesExhausted(self.failures, error) from error
        return delay

    def answered(self) -> None:
        if self.failures:
            self.failures = 0
            self._delays = self.backoff.delays(self._rng)


class Puller:
    """One request at a time, its heartbeat deadline, and the failure that ends the pulling."""

    def __init__(self, after: str | None, idle_heartbeat: float, retrier: Retrier) -> None:
        self.position = after
        """The cursor the next request asks after: the last item kept."""
        self.idle_heartbeat = idle_heartbeat
        self.retrier = retrier
        self.failure: Exception | None = None
        """Why pulling ended: raised to the application once the items kept are delivered."""
        self.pulls = 0
        """Requests sent."""
        self.in_flight: Pull | None = None
        self._sent_at = 0.0

    @property
    def heartbeat_window(self) -> float:
        """ADR-37: a missed heartbeat is reported after twice the idle heartbeat."""
        return 2 * self.idle_heartbeat

    @property
    def heartbeat_deadline(self) -> float | None:
        """When the request in flight counts as a missed heartbeat (None: none in flight)."""
        if self.in_flight is None:
            return None
        return self._sent_at + self.heartbeat_window

    def _send(self, max_results: int, wait_time: float, now: float) -> Pull:
        assert self.in_flight is None, "one request at a time"
        self.in_flight = Pull(self.position, max_results, wait_time)
        self._sent_at = now
        self.pulls += 1
        return self.in_flight

    def _answered(self, reply: EventsReply, batch: Batch) -> int:
        """Keep what fits of the answer to the request in flight; returns how many."""
        pull, self.in_flight = self.in_flight, None
        assert pull is not None, "an answer without a request"
        self.retrier.answered()
        if reply.missed:
            self.failure = ItemsMissed(pull.after, reply.oldest, reply.missed_reason)
            return 0
        kept = batch.add(reply.items)
        if kept:
            self.position = reply.items[kept - 1].cursor
        return kept

    def _failed(self, error: ChangefeedError) -> float | None:
        """The delay before retrying, or None when `error` ends the pulling (self.failure)."""
        self.in_flight = None
        try:
            return self.retrier.failed(error)
        except ChangefeedError as fatal:
            self.failure = fatal
            return None


# --- fetch and next ---------------------------------------------------------------------------


class FetchCore(Puller):
    """One fetch: pulls until it has items and the publisher has no more, the batch is full, a
    failure, or `expires` runs out. A failure after some items ends the fetch with those items
    (the next fetch meets it again); before any, it is raised."""

    def __init__(
        self, options: FetchOptions, after: str | None, retrier: Retrier, now: float
    ) -> None:
        super().__init__(after, options.idle_heartbeat, retrier)
        self.options = options
        self.deadline = now + options.expires
        self.batch = Batch(options.max_messages, options.max_bytes)
        self._more = True
        self._over = False

    def pull(self, now: float) -> Pull | None:
        """The next request, or None when the fetch is over."""
        left = self.deadline - now
        if (self._over or self.failure is not None or left < SHORTEST_WAIT or self.batch.full
                or (len(self.batch) and not self._more)):
            self._over = True
            return None
        return self._send(self.batch.wanted(), min(self.idle_heartbeat, left), now)

    def received(self, reply: EventsReply, now: float) -> None:
        kept = self._answered(reply, self.batch)
        self._more = reply.more or kept < len(reply.items)

    def failed(self, error: ChangefeedError, now: float) -> float | None:
        """The delay before retrying, or None: the fetch is over (result() says how)."""
        delay = self._failed(error)
        if delay is None:
            return None
        if len(self.batch):
            self._over = True  # end with what we have: the next fetch meets the failure again
            return None
        if now + delay >= self.deadline:
            self.failure = error  # the publisher could not be reached within expires
            return None
        return delay

    def result(self) -> list[ChangeItem]:
        """The items fetched; raises the failure when it came before any."""
        if not len(self.batch) and self.failure is not None:
            raise self.failure
        return list(self.batch)


# --- consume ----------------------------------------------------------------------------------


class ConsumeState(enum.Enum):
    RUNNING = "running"
    DRAINING = "draining"
    """No more pulls: the buffered items are delivered, then the consume ends."""
    STOPPED = "stopped"
    """Ended by stop(): buffered items dropped."""
    DONE = "done"
    """Ended: drained, or its failure was raised."""


class ConsumeCore(Puller):
    """One consume: a buffer kept filled up to its limit, refilled at its threshold (ADR-37).

    The cursor is that of the last item taken (delivered), so that a stopped consume loses
    nothing: what was buffered and dropped is pulled again by whatever starts after it.
    """

    def __init__(
        self, options: ConsumeOptions, after: str | None, retrier: Retrier
    ) -> None:
        super().__init__(after, options.idle_heartbeat, retrier)
        self.options = options
        self.cursor = after
        self.state = ConsumeState.RUNNING
        self.buffer = Batch(options.max_messages, options.max_bytes)

    @property
    def finished(self) -> bool:
        """Nothing more will be delivered."""
        if self.state is ConsumeState.DRAINING:
            return not len(self.buffer) and self.failure is None
        return self.state in (ConsumeState.STOPPED, ConsumeState.DONE)

    def low(self) -> bool:
        """The buffer is at or below its threshold (the low watermark)."""
        if self.options.threshold_bytes is not None:
            return self.buffer.bytes <= self.options.threshold_bytes
        assert self.options.threshold_messages is not None
        return len(self.buffer) <= self.options.threshold_messages

    def pull(self, now: float) -> Pull | None:
        """The next request, or None when none is due (in flight, above the threshold, full,
        ended or failed). Each long poll waits `idle_heartbeat`: its answer is the heartbeat."""
        if (self.state is not ConsumeState.RUNNING or self.failure is not None
                or self.in_flight is not None or not self.low() or self.buffer.full):
            return None
        return self._send(self.buffer.wanted(), min(self.idle_heartbeat, MAX_WAIT), now)

    def received(self, reply: EventsReply, now: float) -> int:
        """The answer to the request in flight: keeps what fits; returns how many."""
        if self.state is not ConsumeState.RUNNING:
            self.in_flight = None
            return 0
        return self._answered(reply, self.buffer)

    def failed(self, error: ChangefeedError, now: float) -> float | None:
        """The delay before the next pull, or None when the failure ends the consume: it is
        raised from take() once the buffered items are delivered."""
        return self._failed(error)

    def take(self) -> ChangeItem | None:
        """The next item for the application (the cursor moves to it); None when there is none
        now (see `finished`). Raises the failure that ended the pulling once the buffer is empty.
        """
        if self.state in (ConsumeState.STOPPED, ConsumeState.DONE):
            return None
        item = self.buffer.pop()
        if item is not None:
            self.cursor = item.cursor
            return item
        if self.failure is not None:
            self.state = ConsumeState.DONE
            raise self.failure
        if self.state is ConsumeState.DRAINING:
            self.state = ConsumeState.DONE
        return None

    def stop(self) -> None:
        """End now; the buffered items are dropped (the cursor stays at the last delivered)."""
        if self.state is not ConsumeState.DONE:
            self.state = ConsumeState.STOPPED
        self.buffer.clear()
        self.in_flight = None

    def drain(self) -> None:
        """Pull no more; deliver what is buffered, then end."""
        if self.state is ConsumeState.RUNNING:
            self.state = ConsumeState.DRAINING
            self.in_flight = None
