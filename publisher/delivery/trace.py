"""The per-change delivery trace: for each change its tail read, when this publisher read it and
how many listeners of each service it was written to, and when (the first and the last write).
Pure: no I/O, no clock (the hub passes the times in).

The hub calls `published` once per batch the tail hands it, with the new entries and its writes
of the batch (per connection, the frames it was written: the very bytes objects of the entries,
so a frame names its entry by identity); a connection catching up in its own task calls
`wrote_late` per item. `find` answers `GET /changefeeds/trace/<cursor>` (publisher.web.trace_route).

The trace keeps the newest `items` changes, and none read more than `max_age` seconds ago:
memory is bounded by `items` records of at most `MAX_SERVICES` services each (a service name is
cut to `MAX_SERVICE_CHARS`), whatever listeners register. docs/operations.md#tracing-a-change.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Protocol, TypeVar

from changefeed.cursor import Position, StreamId

MAX_SERVICES = 16
"""Services one change keeps apart; writes to listeners of any further service are counted under
`OTHER`."""
OTHER = "(other services)"
MAX_SERVICE_CHARS = 100
"""A service name longer than this is cut (a registration may name any string)."""

_service = attrgetter("registration.service")
_frames = attrgetter("frames")


class Traced(Protocol):
    """What the trace needs of a window entry: its position and the frames written of it."""

    @property
    def position(self) -> StreamId: ...
    @property
    def frame(self) -> bytes: ...
    @property
    def sse(self) -> bytes | None: ...


class _Registration(Protocol):
    @property
    def service(self) -> str: ...


class Recipient(Protocol):
    """A connection the hub wrote to: its registration names its service."""

    @property
    def registration(self) -> _Registration: ...


R = TypeVar("R", bound=Recipient)


class Queued(Protocol):
    """What the hub wrote to one connection in one batch, in log order."""

    @property
    def frames(self) -> Sequence[bytes]: ...


@dataclass(slots=True)
class Writes:
    """The writes of one change to the listeners of one service."""

    listeners: int
    first: float
    last: float


@dataclass(slots=True)
class Record:
    """One change as this publisher delivered it."""

    position: StreamId
    read_at: float
    """When the tail handed it to the hub (epoch seconds)."""
    services: dict[str, Writes] = field(default_factory=dict)

    def wrote(self, service: str, listeners: int, at: float) -> None:
        """`listeners` more listeners of `service` were written the change at `at`."""
        writes = self.services.get(service)
        if writes is None:
            if len(service) > MAX_SERVICE_CHARS:
                service = service[:MAX_SERVICE_CHARS]
                writes = self.services.get(service)
            if writes is None and len(self.services) >= MAX_SERVICES:
                service = OTHER
                writes = self.services.get(OTHER)
            if writes is None:
                self.services[service] = Writes(listeners, at, at)
                return
        writes.listeners += listeners
        writes.first = min(writes.first, at)
        writes.last = max(writes.last, at)


@dataclass(frozen=True, slots=True)
class NotTraced:
    """Why a cursor has no record: `code` and `message` of the 404 answer."""

    code: str
    message: str


class TraceLog:
    """The records of the newest `items` changes read, none older than `max_age` seconds
    (None: no age limit)."""

    def __init__(self, items: int, max_age: float | None) -> None:
        if items < 1:
            raise ValueError("a trace keeps at least one change")
        self.items = items
        self.max_age = max_age
        self.epoch = ""
        self._order: deque[Record] = deque()
        self._by_position: dict[StreamId, Record] = {}
        self._evicted: StreamId | None = None
        """The newest position dropped from the trace (None: none dropped in this epoch)."""

    def __len__(self) -> int:
        return len(self._order)

    def resize(self, items: int, max_age: float | None, now: float) -> None:
        """Keep `items` changes and `max_age` seconds from now on (a reloaded config)."""
        if items < 1:
            raise ValueError("a trace keeps at least one change")
        self.items, self.max_age = items, max_age
        while len(self._order) > items:
            self._drop()
        self.expire(now)

    # --- recording (the hub's hot path) -----------------------------------------------------

    def published(
        self,
        epoch: str,
        entries: Sequence[Traced],
        written: Mapping[R, Queued],
        delivered: int,
        read_at: float,
        written_at: float,
    ) -> None:
        """The tail read `entries` (new, in log order) at `read_at`; `written` is the hub's
        batch of writes at `written_at`: per connection, the frames it was written, `delivered`
        frames in all.

        When every connection was written every entry (`delivered` says so: the common case)
        a connection costs one tally of its service, done in C (`Counter` over a `map`).
        Otherwise a tally of (service, frames written) tells those written every entry from the
        others, whose frames alone are looked up one by one.
        """
        if epoch != self.epoch:
            self._forget(epoch)
        if not entries:
            return
        records = [self._add(entry.position, read_at) for entry in entries]
        every = len(records)
        if written and delivered == every * len(written):
            for service, count in Counter(map(_service, written)).items():
                for record in records:
                    record.wrote(service, count, written_at)
        elif written:
            partial = False
            counts = map(len, map(_frames, written.values()))
            shapes = Counter(zip(map(_service, written), counts, strict=True))
            for (service, taken), count in shapes.items():
                if taken == every:
                    for record in records:
                        record.wrote(service, count, written_at)
                elif taken:
                    partial = True
            if partial:
                self._attribute(entries, records, written, written_at)
        self.expire(read_at)

    def published_one(
        self, epoch: str, position: StreamId, written: Sequence[R], read_at: float,
        written_at: float,
    ) -> None:
        """`published` of one entry (a tail read of one commit) written to each of `written`
        once: no per-connection mapping, and one listener's service noted without a tally."""
        if epoch != self.epoch:
            self._forget(epoch)
        record = self._add(position, read_at)
        if len(written) == 1:
            record.wrote(_service(written[0]), 1, written_at)
        elif written:
            for service, count in Counter(map(_service, written)).items():
                record.wrote(service, count, written_at)
        self.expire(read_at)

    @staticmethod
    def _attribute(
        entries: Sequence[Traced],
        records: list[Record],
        written: Mapping[R, Queued],
        at: float,
    ) -> None:
        """The connections written some of the entries: each frame names its entry by
        identity (the hub writes the entry's own `frame` or `sse` bytes)."""
        every = len(records)
        of_frame: dict[int, Record] = {}
        for entry, record in zip(entries, records, strict=True):
            of_frame[id(entry.frame)] = record
            if entry.sse is not None:
                of_frame[id(entry.sse)] = record
        for conn, queued in written.items():
            frames = queued.frames
            if 0 < len(frames) < every:
                service = conn.registration.service
                for frame in frames:
                    found = of_frame.get(id(frame))
                    if found is not None:
                        found.wrote(service, 1, at)

    def wrote_late(self, position: StreamId, service: str, at: float) -> None:
        """A listener of `service` catching up was written the change at `position` at `at`."""
        record = self._by_position.get(position)
        if record is not None:
            record.wrote(service, 1, at)

    def _add(self, position: StreamId, at: float) -> Record:
        record = Record(position, at)
        self._order.append(record)
        self._by_position[position] = record
        if len(self._order) > self.items:
            self._drop()
        return record

    def _drop(self) -> None:
        record = self._order.popleft()
        del self._by_position[record.position]
        self._evicted = record.position

    def expire(self, now: float) -> None:
        """Drop the records read more than `max_age` seconds before `now`."""
        if self.max_age is None:
            return
        oldest = now - self.max_age
        order = self._order
        while order and order[0].read_at < oldest:
            self._drop()

    def _forget(self, epoch: str) -> None:
        """A new history (the bucket was recreated or rolled back): nothing traced applies."""
        self.epoch = epoch
        self._order.clear()
        self._by_position.clear()
        self._evicted = None

    # --- answering ----------------------------------------------------------------------------

    def window(self) -> str:
        """The trace window in words: "10000 changes / 600 s"."""
        age = "no age limit" if self.max_age is None else f"{self.max_age:g} s"
        return f"{self.items} changes / {age}"

    def find(self, cursor: Position, epoch: str, head: StreamId, now: float) -> Record | NotTraced:
        """The record of `cursor`, or why there is none. `epoch` and `head` are the hub's: the
        log this publisher reads and how far its tail has read it."""
        self.expire(now)
        if cursor.epoch != epoch:
            return NotTraced(
                "OtherEpoch",
                f"not traced: the cursor is of bucket epoch {cursor.epoch}, this publisher reads "
                f"epoch {epoch or '(none yet)'}",
            )
        position = cursor.position
        current = epoch == self.epoch
        record = self._by_position.get(position) if current else None
        if record is not None:
            return record
        if position > head:
            return NotTraced(
                "NotReadYet",
                f"not traced: this publisher's tail has not read it yet (it has read up to "
                f"{Position.single(epoch, head).encode()})",
            )
        oldest = self._order[0].position if current and self._order else None
        if oldest is not None and position > oldest:
            return NotTraced("NoSuchChange", "no change at this cursor was read by this publisher")
        if current and self._evicted is not None:
            return NotTraced(
                "NotTraced", f"not traced: older than the trace window of {self.window()}"
            )
        since = "" if oldest is None else (
            f" (its oldest traced change is {Position.single(epoch, oldest).encode()})")
        return NotTraced(
            "NotTraced", f"not traced: committed before this publisher began tracing{since}"
        )

    def describe(self, epoch: str) -> dict[str, Any]:
        """The trace window as the route shows it."""
        oldest = self._order[0] if self._order and epoch == self.epoch else None
        return {
            "items": self.items,
            "maxAge": self.max_age,
            "held": len(self._order),
            "oldest": None if oldest is None else Position.single(epoch, oldest.position).encode(),
        }


def iso(at: float) -> str:
    """Epoch seconds as an ISO 8601 UTC time with milliseconds."""
    millis = round(at * 1000)
    seconds, ms = divmod(millis, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ms:03d}Z"


def record_body(
    record: Record, cursor: Position, publisher_id: str, shown: str | None = None
) -> dict[str, Any]:
    """A record as `GET /changefeeds/trace/<cursor>` answers it (times as ISO strings, and as
    milliseconds after the commit: the commit's time is Redis's, the others this host's).
    `cursor` is the change's own position; `shown` the cursor asked for (default: `cursor`)."""
    committed = cursor.position.ms / 1000

    def after(at: float) -> float:
        return round((at - committed) * 1000, 3)

    services = {
        name: {
            "listeners": writes.listeners,
            "firstWrite": iso(writes.first),
            "lastWrite": iso(writes.last),
            "firstWriteMs": after(writes.first),
            "lastWriteMs": after(writes.last),
        }
        for name, writes in sorted(record.services.items())
    }
    return {
        "cursor": shown or cursor.encode(),
        "publisher": publisher_id,
        "committedAt": iso(committed),
        "readAt": iso(record.read_at),
        "readMs": after(record.read_at),
        "listeners": sum(w.listeners for w in record.services.values()),
        "services": services,
    }


__all__ = [
    "MAX_SERVICES",
    "MAX_SERVICE_CHARS",
    "OTHER",
    "NotTraced",
    "Record",
    "TraceLog",
    "Writes",
    "iso",
    "record_body",
]
