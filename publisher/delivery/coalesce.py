"""Coalesced catch-up of a slow listener that asked for it (`"coalesce": true`). Pure code.

A listener registered with `coalesce` that falls out of the shared window is not closed with 4008:
from the moment the window would move past it, the hub folds every item for it into its
`Coalesced` set instead, keyed by (resource, changedResourceId), and its catch-up task drains
the set one item per id. The set is bounded by distinct ids (`limit`), not by items: a listener
that would need more is closed with 4008 as before (docs/protocol.md#coalesced-catch-up).

What a drained item is:

- one per (resource, id) pending, in order of the newest change of each id (the order in which
  the ids were last changed): so the cursors the listener receives only grow;
- its sub-resources are the union of those of the changes it stands for, in first-seen order;
  `published` and `cursor` are those of the newest of them;
- it carries `"coalesced": true`, and the last one of a catch-up also `"caughtUp": true`: once
  it is sent the listener is live again and its cursor is a resume point after which nothing
  is missing.

An id changed again while it waits moves to the end of the order; one changed again after it was
sent is pending again (a new change, sent again). So nothing is lost and nothing repeats beyond
the merging of an id's changes into one item.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from changefeed.cursor import Position, StreamId
from changefeed.protocol import ChangeItem

Key = tuple[str, str]
"""(resource, changedResourceId)."""


@dataclass(slots=True)
class Pending:
    """The changes of one id not sent yet, merged."""

    sub_resources: list[str]
    position: StreamId
    """The newest change's position."""
    items: int = 1
    """How many changes (log items) this one item stands for."""
    cursor: str | None = None
    """The newest change's cursor as the hub stamped it (a bucket in a Redis Cluster: the
    composite cursor after it); None: the cursor of `position` in the epoch."""
    published: int | None = None
    """The newest change's commit time (ms), when `position` is not a stream id."""

    def item(self, key: Key, epoch: str, *, last: bool) -> ChangeItem:
        """The item sent for this id: the merged sub-resources, the newest cursor."""
        resource, changed = key
        return ChangeItem(
            resource, tuple(self.sub_resources), changed,
            self.position.ms if self.published is None else self.published,
            self.cursor or Position.single(epoch, self.position).encode(), coalesced=True,
            caught_up=last,
        )


class CoalesceOverflow(Exception):
    """More distinct ids are pending than the limit allows: close the listener (4008)."""


class Coalesced:
    """The pending ids of one slow listener, in order of their newest change."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the coalesced set's limit must be >= 1")
        self.limit = limit
        self._pending: dict[Key, Pending] = {}
        self.folded = 0
        """Items folded in since this catch-up began."""
        self.sent_ids = 0
        """Items sent (one per id pending at the time) since this catch-up began."""

    def __len__(self) -> int:
        return len(self._pending)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def fold(
        self, resource: str, sub_resources: Iterable[str], changed_resource_id: str,
        position: StreamId, cursor: str | None = None, published: int | None = None,
    ) -> None:
        """Record a change for this listener. Positions must grow from call to call. `cursor`
        (and `published`): the change's own, when the position is not its stream id.

        Raises CoalesceOverflow when it is a new id and `limit` ids are pending already.
        """
        key = (resource, changed_resource_id)
        pending_ids = self._pending
        pending = pending_ids.pop(key, None)
        if pending is None:
            if len(pending_ids) >= self.limit:
                raise CoalesceOverflow(self.limit)
            pending = Pending(list(dict.fromkeys(sub_resources)), position, 1, cursor, published)
        else:
            known = pending.sub_resources
            for sub in sub_resources:
                if sub not in known:
                    known.append(sub)
            pending.position = position
            pending.cursor = cursor
            pending.published = published
            pending.items += 1
        pending_ids[key] = pending  # re-inserted: last in the order of newest changes
        self.folded += 1

    def pop(self, epoch: str) -> tuple[ChangeItem, StreamId]:
        """The next item to send and its position: the id whose newest change is the oldest.
        `caught_up` is set when the set is empty after it. Raises StopIteration when nothing
        is pending."""
        key = next(iter(self._pending))
        pending = self._pending.pop(key)
        self.sent_ids += 1
        return pending.item(key, epoch, last=not self._pending), pending.position
