"""Jepsen-style accounting for the fault scenarios: pure, no I/O, no clock of its own.

A `History` records what the writer was told and what each listener delivered:

- every commit attempt of the writer, with its outcome: *acknowledged* (``commit`` returned a
  cursor), *unknown* (the commit may or may not have been written: a timeout after the request
  was sent) or *failed* (nothing was written);
- per listener, in delivery order: each ``Change`` (cursor, id), each ``Resync``, each
  bootstrap (``BootstrapStart`` … ``BootstrapRecords`` … ``BootstrapDone``) with the
  ``(id, seq)`` of every object it delivered.

Every record gets a logical stamp from one counter, so "acknowledged before that Resync" is
well defined, and a time (given by the caller) for the time-to-recover figure.

`History.verdict()` classifies, for every listener, every acknowledged commit it was owed:

received
    a ``Change`` with the commit's cursor and id was delivered.
covered
    not received, but a *completed* bootstrap of that listener delivered the same id at a
    ``seq`` at least the commit's: the view the listener was handed already reflects the
    change, so nothing is missing from it.
lost, announced
    neither received nor covered, and the listener got a ``Resync`` after the commit was
    sent (`Attempt.since`: its effect lies anywhere between its first try and its
    acknowledgement; a commit retried under its key after an unknown outcome may have been
    written by the first try, before that Resync): the data is gone (for example Redis
    restarted without persistence), but the listener was told to throw its view away and
    bootstrap again.
lost
    neither received nor covered nor announced: an acknowledged change the listener never
    heard of and was never told it missed. The suite fails on any of these.

and counts, per listener, deliveries of a change already delivered (*duplicated*), changes
delivered after a change of a later cursor of the same epoch since the last ``Resync``
(*reordered*; cursors of one epoch sort in publish order as strings, docs/protocol.md), and
changes whose cursor the writer was never told about (*unacknowledged*) — unless a commit of
that id had an unknown outcome, which may have been written (*maybe*, not an error).

Three kinds of listener bend these rules as their contracts say (the nemesis has all three):

- a *coalescing* listener (``Listener(coalesce=True)``) may get one coalesced item per id for
  several changes: an acknowledged change is *received* when a coalesced item of its id, at its
  cursor or a later one of the same epoch, was delivered; and an id already received coalesced
  may come again (docs/protocol.md, coalesced catch-up), which is neither a duplicate nor a
  reordering;
- an *at-least-once* log (a durable consumer) may be handed an item again until its ack takes
  effect: repeats and out-of-order redeliveries are not counted; what is counted instead is a
  delivery of an item after an ack of it was *applied* (`ListenerLog.redelivered_after_ack`);
- after a rollback the bucket gets a new epoch and keeps its log, so a reader that starts over
  sees surviving items under new-epoch cursors: a delivery is matched to a commit by its
  cursor, or by its position (the part after the epoch) and id.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from faults import watch


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
    history: History
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
        self.changes.append(Delivered(cursor, id, self.history.tick(), time, coalesced))
        self._delivered.add((cursor, id))
        self._delivered.add((position_of(cursor), id))
        if coalesced:
            key = (epoch_of(cursor), id)
            self._coalesced[key] = max(cursor, self._coalesced.get(key, cursor))

    def acked(self, cursor: str, id: str, time: float) -> None:
        """A durable consumer's ack of `cursor` took effect."""
        self.acks.append(Acked(cursor, id, self.history.tick(), time))

    def resync(self, reason: str, time: float) -> None:
        self.resyncs.append(Resynced(reason, self.history.tick(), time))

    def resumed(self, cursor: str, time: float) -> None:
        """The listener starts again after `cursor`, one it was given."""
        self.resumes.append(Resumed(cursor, self.history.tick(), time))

    def told_epoch(self, cursor: str, time: float) -> None:
        """The listener's transport said `cursor` is its position in a new epoch."""
        self.told.append(Resumed(cursor, self.history.tick(), time))

    def bootstrap_start(self) -> None:
        """A bootstrap begins (again): what an unfinished one delivered no longer counts."""
        self._pending = {}

    def bootstrap_records(self, states: Iterable[tuple[str, int]]) -> None:
        assert self._pending is not None, "records outside a bootstrap"
        for id, seq in states:
            self._pending[id] = max(seq, self._pending.get(id, seq))

    def bootstrap_done(self, time: float) -> None:
        assert self._pending is not None, "BootstrapDone without BootstrapStart"
        self.bootstraps.append(Bootstrap(self._pending, self.history.tick(), time))
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


@dataclass(frozen=True, slots=True)
class Tally:
    """The verdict for one listener, or the sum over listeners."""

    owed: int = 0
    received: int = 0
    covered: int = 0
    lost: int = 0
    lost_announced: int = 0
    duplicated: int = 0
    reordered: int = 0
    unacknowledged: int = 0
    maybe_received: int = 0
    resyncs: int = 0
    errors: int = 0
    split: int = 0
    """Atomic commits seen in part, or split by a Resync (`faults.watch.split`)."""
    unresumable: int = 0
    unannounced: int = 0

    def __add__(self, other: Tally) -> Tally:
        return Tally(*(a + b for a, b in zip(self.fields(), other.fields(), strict=True)))

    def fields(self) -> tuple[int, ...]:
        return (self.owed, self.received, self.covered, self.lost, self.lost_announced,
                self.duplicated, self.reordered, self.unacknowledged, self.maybe_received,
                self.resyncs, self.errors, self.split, self.unresumable, self.unannounced)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The verdict of a whole history: per listener and in total."""

    committed: int
    unknown: int
    failed: int
    listeners: dict[str, Tally]

    @property
    def total(self) -> Tally:
        return sum(self.listeners.values(), Tally())

    def problems(self) -> list[str]:
        """What breaks the guarantees: unannounced losses, reordering, unacknowledged
        deliveries, errors, a new epoch's change before its announcement. (Duplicates are
        listed too: docs/protocol.md and docs/listener.md promise each change once per
        listener, across reconnects.)"""
        return self._counted(PROBLEMS)

    def findings(self) -> list[str]:
        """What the watch properties that the system does not promise yet found (`FINDINGS`):
        printed with every verdict, kept in the history, not failing a run."""
        return self._counted(FINDINGS)

    def _counted(self, kinds: tuple[str, ...]) -> list[str]:
        return [f"{name}: {what}={getattr(tally, what)}"
                for name, tally in self.listeners.items() for what in kinds
                if getattr(tally, what)]


PROBLEMS = ("lost", "duplicated", "reordered", "unacknowledged", "errors", "unannounced")
"""The counts that fail a run."""
FINDINGS = ("split", "unresumable")
"""The counts of etcd's *atomic* and *resumable* that are reported, not yet failing a run: a
websocket or SSE listener is sent a commit_many batch's changes one frame each, so a Resync
between two frames splits the batch, and a resumption across an epoch change is judged by its
position alone (docs/reliability.md, "Watch properties")."""


class History:
    """Everything a scenario observed. Call `verdict()` at the end."""

    def __init__(self) -> None:
        self._clock = 0
        self.attempts: list[Attempt] = []
        self.listeners: dict[str, ListenerLog] = {}

    def tick(self) -> int:
        """The next logical stamp: records are ordered by these."""
        self._clock += 1
        return self._clock

    def acknowledged(self, id: str, seq: int, cursor: str, time: float, *,
                     stamp: int | None = None, since: int | None = None,
                     batch: str | None = None) -> Attempt:
        """An acknowledged commit. `stamp`: one taken (`tick()`) when the writer was acknowledged,
        if that was before it learnt the cursor (a PostgreSQL outbox commit: acknowledged at its
        COMMIT, its cursor learnt from the relay's record later); the attempt takes its place
        in stamp order. `since`: the stamp taken when the writer first sent it (`tick()`).
        `batch`: the atomic commit it was part of."""
        stamp = self.tick() if stamp is None else stamp
        return self._attempt(
            Attempt(id, seq, Outcome.ACKNOWLEDGED, cursor, stamp, time, since, batch))

    def unknown(self, id: str, seq: int, time: float) -> Attempt:
        return self._attempt(Attempt(id, seq, Outcome.UNKNOWN, None, self.tick(), time))

    def failed(self, id: str, seq: int, time: float) -> Attempt:
        return self._attempt(Attempt(id, seq, Outcome.FAILED, None, self.tick(), time))

    def _attempt(self, attempt: Attempt) -> Attempt:
        bisect.insort(self.attempts, attempt, key=lambda a: a.stamp)
        return attempt

    def listener(self, name: str, after: Attempt | None = None, *,
                 at_least_once: bool = False) -> ListenerLog:
        """A new listener's log; it is owed every acknowledged commit after `after`."""
        assert name not in self.listeners, name
        log = ListenerLog(name, self, after.stamp if after else -1, at_least_once)
        self.listeners[name] = log
        return log

    @property
    def acked(self) -> list[Attempt]:
        return [a for a in self.attempts if a.outcome is Outcome.ACKNOWLEDGED]

    def verdict(self) -> Verdict:
        acked = self.acked
        unknown = [a for a in self.attempts if a.outcome is Outcome.UNKNOWN]
        return Verdict(
            committed=len(acked),
            unknown=len(unknown),
            failed=sum(1 for a in self.attempts if a.outcome is Outcome.FAILED),
            listeners={name: tally(log, acked, unknown) for name, log in self.listeners.items()},
        )


def classify(log: ListenerLog, attempt: Attempt) -> str:
    """What became of an acknowledged commit `log` is owed: `received`, `covered`,
    `announced` (lost, with a Resync after it) or `lost`."""
    if log.received(attempt):
        return "received"
    if log.covered(attempt):
        return "covered"
    if any(r.stamp > attempt.sent for r in log.resyncs):
        return "announced"
    return "lost"


def strangers(log: ListenerLog, acked: Sequence[Attempt]) -> list[Delivered]:
    """Deliveries of `log` whose (cursor or position, id) no acknowledged commit had."""
    known = {(a.cursor, a.id) for a in acked}
    known |= {(position_of(a.cursor or ""), a.id) for a in acked}
    return [c for c in log.changes
            if (c.cursor, c.id) not in known and (position_of(c.cursor), c.id) not in known]


def tally(log: ListenerLog, acked: Sequence[Attempt], unknown: Sequence[Attempt]) -> Tally:
    """Classify every commit `log` was owed, and count what it delivered wrongly."""
    delivered = Counter((c.cursor, c.id) for c in log.changes)
    owed = [a for a in acked if a.stamp > log.after]
    classes = Counter(classify(log, attempt) for attempt in owed)
    received, covered = classes["received"], classes["covered"]
    lost, announced = classes["lost"], classes["announced"]
    known = {(a.cursor, a.id) for a in acked}
    known |= {(position_of(a.cursor or ""), a.id) for a in acked}
    strangers: dict[str, set[str]] = defaultdict(set)
    for cursor, id in delivered:
        if (cursor, id) not in known and (position_of(cursor), id) not in known:
            strangers[id].add(position_of(cursor))  # one item, whatever epoch it came under
    maybes = Counter(a.id for a in unknown)
    maybe_received = sum(min(len(cursors), maybes[id]) for id, cursors in strangers.items())
    unacknowledged = sum(len(cursors) for cursors in strangers.values()) - maybe_received
    return Tally(
        owed=len(owed),
        received=received,
        covered=covered,
        lost=lost,
        lost_announced=announced,
        duplicated=duplicated(log),
        reordered=reordered(log),
        unacknowledged=unacknowledged,
        maybe_received=maybe_received,
        resyncs=len(log.resyncs),
        errors=len(log.errors),
        split=watch.split(log, acked),
        unresumable=watch.unresumable(log, acked),
        unannounced=watch.unannounced(log),
    )


def duplicated(log: ListenerLog) -> int:
    """Changes delivered again (same cursor and id), unless `log.excused` them."""
    seen: set[tuple[str, str]] = set()
    count = 0
    for n, change in enumerate(log.changes):
        key = (change.cursor, change.id)
        if key in seen and not log.excused(change, log.changes[:n]):
            count += 1
        seen.add(key)
    return count


def reordered(log: ListenerLog) -> int:
    """Changes delivered after one with a later cursor of the same epoch, since the last
    Resync before them (a Resync starts the listener's view over)."""
    resync_stamps = [r.stamp for r in log.resyncs]
    count = 0
    newest: dict[str, str] = {}
    era = 0
    for n, change in enumerate(log.changes):
        current = sum(1 for s in resync_stamps if s < change.stamp)
        if current != era:
            era, newest = current, {}
        epoch = epoch_of(change.cursor)
        if epoch in newest and change.cursor < newest[epoch]:
            if not log.excused(change, log.changes[:n]):
                count += 1
        else:
            newest[epoch] = change.cursor
    return count


__all__ = [
    "Acked",
    "Attempt",
    "Bootstrap",
    "Delivered",
    "History",
    "ListenerLog",
    "Outcome",
    "Resumed",
    "Resynced",
    "Tally",
    "Verdict",
    "classify",
    "duplicated",
    "epoch_of",
    "position_of",
    "reordered",
    "strangers",
    "tally",
]
