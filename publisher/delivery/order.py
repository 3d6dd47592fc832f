"""The hub's order: where each entry sits in the window, and the cursor it carries. Pure code.

The window (`publisher.delivery.window`) needs one order of the entries it holds; what a listener
resumes from is a position in every shard of the bucket (`publisher.bucket.Vector`). The bucket's
capability `ordered` chooses between the two ways of tying them:

- `TotalOrder` (an ordered bucket: one shard, one id sequence): an entry's window position *is*
  its stream id, and its cursor, ``<epoch>.<id>``, is built from it when needed. Nothing is
  stamped: the fan-out of one commit costs what it always did.
- `Stamped` (a bucket in a Redis Cluster: a log per shard): each entry gets a process-local
  window position (`StreamId(newest ms so far, serial)`), which never leaves the process, and is
  stamped with the composite cursor of *everything delivered so far* (the vector: each shard's
  newest position): the cursor it carries and that a listener resumes from, on any publisher.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from changefeed.cursor import ZERO, Position, StreamId
from changefeed.protocol import ChangeItem
from publisher.bucket import LogEntry, Vector


@dataclass(frozen=True, slots=True)
class StampedEntry(LogEntry):
    """A shard's entry as the hub sees it under `Stamped`: `position` is local to this process,
    `cursor` the composite cursor after it, `published` its commit's Redis time (ms)."""

    cursor: str = ""
    published: int = 0

    def item(self, epoch: str) -> ChangeItem:
        return ChangeItem(
            self.resource, self.sub_resources, self.changed_resource_id, self.published,
            self.cursor,
        )


class TotalOrder:
    """The window position of an entry is its stream id (see the module's docstring)."""

    composite = False

    def vector(self, epoch: str, head: StreamId) -> Vector:
        """Everything delivered, the window's head being `head`."""
        return Vector(epoch, (head,), False)

    def position(self, shard: int, head: StreamId) -> StreamId:
        """What was delivered of shard `shard`, the window's head being `head`."""
        return head

    def restart(self, epoch: str, heads: Sequence[StreamId]) -> StreamId:
        """A new history from `heads`; the window's new base."""
        return heads[0]

    def stamp(self, shard: int, entries: Sequence[LogEntry]) -> Sequence[LogEntry]:
        return entries

    def skipped(self, shard: int, trimmed: StreamId) -> StreamId:
        """Shard `shard` was trimmed past the window head: the window's new base."""
        return trimmed

    def cursor(self, epoch: str, position: StreamId, stamped: str | None) -> str:
        """The cursor of the window entry at `position` (stamped with `stamped`)."""
        return Position.single(epoch, position).encode()

    def keep(self, changes: int) -> None:
        """Nothing to keep: a window position is the change's own."""

    def local(self, shard: int, position: StreamId) -> StreamId | None:
        """The window position of the change at `position` of `shard`: the same."""
        return position

    def vector_at(self, epoch: str, position: StreamId) -> Vector | None:
        """The vector of window position `position`: the position itself."""
        return Vector(epoch, (position,), False)

    def window_position(self, start: Vector) -> StreamId | None:
        """The window position the stream after `start` goes on from, when the window may
        hold it: any position (the caller checks that the window covers it)."""
        return start.positions[0]

    def replay_target(
        self, epoch: str, base: StreamId, head: StreamId
    ) -> tuple[Vector, StreamId]:
        """Up to where a resume replays from Redis (the window's base), and the window
        position it then goes on from."""
        return Vector(epoch, (base,), False), base


class Stamped:
    """Local window positions, entries stamped with the vector (see the module's docstring)."""

    composite = True

    def __init__(self) -> None:
        self._vector = Vector("", (ZERO,), True)
        self.remember = 0
        """How many of the newest changes' window positions `local` finds (the delivery
        trace's size; 0 while it is off)."""
        self._locals: OrderedDict[tuple[int, StreamId], StreamId] = OrderedDict()
        """Everything delivered: each shard's newest position delivered."""
        self._serial = 0
        self._ms = 0

    def keep(self, changes: int) -> None:
        """Let `local` find the window positions of the newest `changes` changes (0: none)."""
        self.remember = changes

    def _next(self, ms: int) -> StreamId:
        self._serial += 1
        self._ms = max(self._ms, ms)
        return StreamId(self._ms, self._serial)

    def vector(self, epoch: str, head: StreamId) -> Vector:
        return self._vector

    def position(self, shard: int, head: StreamId) -> StreamId:
        return self._vector.positions[shard]

    def restart(self, epoch: str, heads: Sequence[StreamId]) -> StreamId:
        self._vector = Vector(epoch, tuple(heads), True)
        self._locals.clear()
        return self._next(0)

    def stamp(self, shard: int, entries: Sequence[LogEntry]) -> Sequence[LogEntry]:
        """`entries` of `shard`, the next delivered: each with its local position and the
        cursor after it."""
        out: list[LogEntry] = []
        for entry in entries:
            if entry.position <= self._vector.positions[shard]:
                continue  # already delivered (a re-read after a Redis reconnect)
            self._vector = self._vector.advanced(shard, entry.position)
            local = self._next(entry.position.ms)
            out.append(StampedEntry(
                local, entry.resource, entry.sub_resources,
                entry.changed_resource_id, self._vector.encode(), entry.position.ms,
            ))
            if self.remember:
                locals_ = self._locals
                locals_[(shard, entry.position)] = local
                while len(locals_) > self.remember:
                    locals_.popitem(last=False)
        return out

    def local(self, shard: int, position: StreamId) -> StreamId | None:
        """The window position the change at `position` of `shard` was given, while it is among
        the newest `remember` (None otherwise)."""
        return self._locals.get((shard, position))

    def skipped(self, shard: int, trimmed: StreamId) -> StreamId:
        self._vector = self._vector.advanced(shard, trimmed)
        return self._next(0)

    def cursor(self, epoch: str, position: StreamId, stamped: str | None) -> str:
        return stamped or ""

    def vector_at(self, epoch: str, position: StreamId) -> Vector | None:
        """None: a local position is no position of any shard."""
        return None

    def window_position(self, start: Vector) -> StreamId | None:
        return None

    def replay_target(
        self, epoch: str, base: StreamId, head: StreamId
    ) -> tuple[Vector, StreamId]:
        """A resume replays from Redis up to everything delivered, then goes on from the
        window head."""
        return self._vector, head


Order = TotalOrder | Stamped


def order_of(bucket: Any) -> Order:
    """The order for `bucket`'s hub: `TotalOrder` for an ordered bucket (or none, in a
    benchmark of the fan-out alone), else `Stamped`."""
    return Stamped() if bucket is not None and not bucket.log.ordered else TotalOrder()


__all__ = ["Order", "Stamped", "StampedEntry", "TotalOrder", "order_of"]
