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
from collections.abc import Sequence
from dataclasses import dataclass

from faults import watch
from faults.records import (
    Attempt,
    Delivered,
    ListenerLog,
    Outcome,
    epoch_of,
    position_of,
)


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
        log = ListenerLog(name, self.tick, after.stamp if after else -1, at_least_once)
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
    "History",
    "Tally",
    "Verdict",
    "classify",
    "duplicated",
    "reordered",
    "strangers",
    "tally",
]
