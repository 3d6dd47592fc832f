"""The records of a fault scenario's history (faults/oracle.py): what the writer was told of
each commit (`Attempt`) and what each listener delivered, in order (`ListenerLog`); pure values,
read by the oracle's accounting and by the watch properties (faults/watch.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum


class Outcome(Enum):
    """What the writer was told about one commit."""

    ACKNOWLEDGED = "acknowledged"
    UNKNOWN = "unknown"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One commit of resource `id` with state number `seq` (`cursor` when acknowledged)."""

    id: str
    seq: int
    outcome: Outcome
    cursor: str | None
    stamp: int
    time: float
    since: int | None = None
    """The stamp taken when the writer first sent this commit (None: `stamp`). Its effect lies
    anywhere between the two: a Resync in between may have been sent after it was written."""
    batch: str | None = None
    """The atomic commit it was part of (a `commit_many`, an outbox batch): None when alone."""

    @property
    def sent(self) -> int:
        return self.stamp if self.since is None else self.since


@dataclass(frozen=True, slots=True)
class Delivered:
    """A ``Change`` a listener delivered."""

    cursor: str
    id: str
    stamp: int
    time: float
    coalesced: bool = False


@dataclass(frozen=True, slots=True)
class Acked:
    """An acknowledgement of a durable consumer's delivery that took effect (`applied`)."""

    cursor: str
    id: str
    stamp: int
    time: float


@dataclass(frozen=True, slots=True)
class Resynced:
    """A ``Resync`` a listener delivered."""

    reason: str
    stamp: int
    time: float


@dataclass(frozen=True, slots=True)
class Resumed:
    """A listener started again after `cursor`, one it was given (`faults.watch.unresumable`);
    or, as `told`, was told that `cursor` is its position in a new epoch."""

    cursor: str
    stamp: int
    time: float


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """A completed bootstrap: id -> the highest ``seq`` it delivered for that id."""

    states: dict[str, int]
    stamp: int
    time: float


def epoch_of(cursor: str) -> str:
    """The epoch part of a cursor (`<epoch>.<position>`)."""
    return cursor.partition(".")[0]


def position_of(cursor: str) -> str:
    """The position part of a cursor (`<epoch>.<position>`): the same log item keeps it when a
    rollback gives the bucket a new epoch."""
    return cursor.partition(".")[2]


@dataclass
class ListenerLog:
    """What one listener delivered, in order. `after`: the stamp of the last commit it is *not*
    owed (a listener that resumes from a stored cursor is owed only what came after it)."""

    name: str
    tick: Callable[[], int]
    """The history's clock (`History.tick`): the stamp of each record."""
    after: int = -1
    at_least_once: bool = False
    """A durable consumer's log: redeliveries before an applied ack are allowed."""
    changes: list[Delivered] = field(default_factory=list)
    acks: list[Acked] = field(default_factory=list)
    resyncs: list[Resynced] = field(default_factory=list)
    bootstraps: list[Bootstrap] = field(default_factory=list)
    resumes: list[Resumed] = field(default_factory=list)
    told: list[Resumed] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _pending: dict[str, int] | None = None
    _delivered: set[tuple[str, str]] = field(default_factory=set)
    _coalesced: dict[tuple[str, str], str] = field(default_factory=dict)
    """(epoch, id) -> the newest cursor of a coalesced item of that id."""

    def change(self, cursor: str, id: str, time: float, *, coalesced: bool = False) -> None:
        self.changes.append(Delivered(cursor, id, self.tick(), time, coalesced))
        self._delivered.add((cursor, id))
        self._delivered.add((position_of(cursor), id))
        if coalesced:
            key = (epoch_of(cursor), id)
            self._coalesced[key] = max(cursor, self._coalesced.get(key, cursor))

    def acked(self, cursor: str, id: str, time: float) -> None:
        """A durable consumer's ack of `cursor` took effect."""
        self.acks.append(Acked(cursor, id, self.tick(), time))

    def resync(self, reason: str, time: float) -> None:
        self.resyncs.append(Resynced(reason, self.tick(), time))

    def resumed(self, cursor: str, time: float) -> None:
        """The listener starts again after `cursor`, one it was given."""
        self.resumes.append(Resumed(cursor, self.tick(), time))

    def told_epoch(self, cursor: str, time: float) -> None:
        """The listener's transport said `cursor` is its position in a new epoch."""
        self.told.append(Resumed(cursor, self.tick(), time))

    def bootstrap_start(self) -> None:
        """A bootstrap begins (again): what an unfinished one delivered no longer counts."""
        self._pending = {}

    def bootstrap_records(self, states: Iterable[tuple[str, int]]) -> None:
        assert self._pending is not None, "records outside a bootstrap"
        for id, seq in states:
            self._pending[id] = max(seq, self._pending.get(id, seq))

    def bootstrap_done(self, time: float) -> None:
        assert self._pending is not None, "BootstrapDone without BootstrapStart"
        self.bootstraps.append(Bootstrap(self._pending, self.tick(), time))
        self._pending = None

    def error(self, what: str) -> None:
        """Something the scenario counts as a failure of its own (an unexpected close code)."""
        self.errors.append(what)

    def received(self, attempt: Attempt) -> bool:
        """Whether this listener delivered `attempt` as a Change (by cursor, or by position
        after a new epoch), or a coalesced item of its id at its cursor or a later one."""
        cursor = attempt.cursor or ""
        if (cursor, attempt.id) in self._delivered:
            return True
        if (position_of(cursor), attempt.id) in self._delivered:
            return True
        newest = self._coalesced.get((epoch_of(cursor), attempt.id))
        return newest is not None and newest >= cursor

    def excused(self, change: Delivered, earlier: Sequence[Delivered]) -> bool:
        """Whether delivering `change` again, or after a later cursor, is allowed: on an
        at-least-once log, or for an id already received coalesced at that cursor or later
        (an interrupted catch-up resumes from before it)."""
        if self.at_least_once:
            return True
        return any(e.coalesced and e.id == change.id and e.cursor >= change.cursor
                   for e in earlier)

    def redelivered_after_ack(self) -> list[tuple[Acked, Delivered]]:
        """Deliveries of an item (by position and id) after an ack of it was applied."""
        acked: dict[tuple[str, str], Acked] = {}
        found: list[tuple[Acked, Delivered]] = []
        events: list[Acked | Delivered] = [*self.acks, *self.changes]
        for event in sorted(events, key=lambda e: e.stamp):
            key = (position_of(event.cursor), event.id)
            if isinstance(event, Acked):
                acked.setdefault(key, event)
            elif key in acked:
                found.append((acked[key], event))
        return found

    def covered(self, attempt: Attempt) -> bool:
        """Whether a completed bootstrap delivered `attempt`'s id at its seq or a later one."""
        return any(b.states.get(attempt.id, -1) >= attempt.seq for b in self.bootstraps)

    def has(self, attempt: Attempt) -> bool:
        """Received or covered: the listener's view reflects `attempt`."""
        return self.received(attempt) or self.covered(attempt)

    def first_delivery_after(self, time: float) -> float | None:
        """When this listener first delivered a change, or completed a bootstrap, at or after
        `time` (None if it did not)."""
        times = [c.time for c in self.changes if c.time >= time]
        times += [b.time for b in self.bootstraps if b.time >= time]
        return min(times, default=None)


__all__ = ["Acked", "Attempt", "Bootstrap", "Delivered", "ListenerLog", "Outcome", "Resumed",
           "Resynced", "epoch_of", "position_of"]
