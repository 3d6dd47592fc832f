"""etcd's watch properties, beside the oracle's lost/duplicated/reordered (faults/oracle.py):
pure counts over one listener's log and the acknowledged commits.

- *atomic* (`split`): the changes of one atomic commit (a `commit_many` batch, an outbox
  batch: the attempts sharing a `batch`) are delivered together: a listener that received one
  of them received every one it was owed, and no Resync came between them.
- *resumable* (`unresumable`): a listener resuming from a cursor it was given (`resumed`) gets
  exactly what followed it: nothing at or before the cursor's position, and no acknowledged
  commit between the cursor and its next delivery skipped.
- *announced* (`unannounced`): a listener is told of an epoch change (a Resync, a completed
  bootstrap, or `told`: its transport said where its position stands in the new epoch) before
  any change of the new epoch reaches it.

Neither *atomic* nor *announced* is asked of an at-least-once log (a durable consumer's): its
instances share the work, so one commit's changes may go to several of them, and its
announcement of a loss is its dead-letter record, read beside the messages, not before them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from faults.records import Attempt, ListenerLog


def _epoch(cursor: str) -> str:
    """The epoch of an ordered (`<epoch>.<id>`) or composite (`<epoch>~<p0>~...`) cursor."""
    return cursor.split("~", 1)[0] if "~" in cursor else cursor.partition(".")[0]


def _position(cursor: str) -> str:
    return cursor.split("~", 1)[1] if "~" in cursor else cursor.partition(".")[2]


def split(log: ListenerLog, acked: Sequence[Attempt]) -> int:
    """The atomic commits `log` saw part of, or saw with a Resync between their changes."""
    if log.at_least_once:
        return 0
    batches: dict[str, list[Attempt]] = defaultdict(list)
    for attempt in acked:
        if attempt.batch is not None and attempt.stamp > log.after:
            batches[attempt.batch].append(attempt)
    count = 0
    for attempts in batches.values():
        had = [log.received(a) or log.covered(a) for a in attempts]
        if any(had) and not all(had):
            count += 1
            continue
        positions = {_position(a.cursor or "") for a in attempts}
        ids = {a.id for a in attempts}
        stamps = [c.stamp for c in log.changes
                  if c.id in ids and _position(c.cursor) in positions]
        if stamps and any(min(stamps) < r.stamp < max(stamps) for r in log.resyncs):
            count += 1
    return count


def unresumable(log: ListenerLog, acked: Sequence[Attempt]) -> int:
    """The resumptions of `log` after which it was not given exactly what followed the cursor:
    a change at or before its position (taken again), or an acknowledged commit between the
    cursor and the first change after it that never reached the listener (skipped)."""
    count = 0
    for resumed in log.resumes:
        ends = [r.stamp for r in log.resyncs if r.stamp > resumed.stamp]
        end = min(ends, default=None)
        after = [c for c in log.changes
                 if c.stamp > resumed.stamp and (end is None or c.stamp < end)]
        position = _position(resumed.cursor)
        if any(_position(c.cursor) <= position for c in after):
            count += 1
            continue
        if after:
            first = _position(after[0].cursor)
            if any(position < _position(a.cursor or "") < first and not log.received(a)
                   and not log.covered(a) for a in acked):
                count += 1
    return count


def unannounced(log: ListenerLog) -> int:
    """Changes of a new epoch that reached `log` before it was told of the epoch change."""
    if log.at_least_once:
        return 0
    told = sorted([r.stamp for r in log.resyncs] + [b.stamp for b in log.bootstraps]
                  + [t.stamp for t in log.told])
    count = 0
    previous = None
    for change in log.changes:
        epoch = _epoch(change.cursor)
        if previous is not None and epoch != _epoch(previous.cursor) and not any(
            previous.stamp < stamp < change.stamp for stamp in told
        ):
            count += 1
        previous = change
    return count


__all__ = ["split", "unannounced", "unresumable"]
