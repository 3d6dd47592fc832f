"""A position in every shard of a bucket: what a cursor names, as a value. Pure code.

A bucket is a set of shards, each a log with one id sequence (`publisher.bucket.log.shard`). A
position in the bucket is one stream id per shard, with the bucket's epoch: a `Vector`. On the
wire it is exactly today's cursors:

- an ordered bucket (a single Redis or Sentinel: one shard, its partitions sharing one id
  sequence) has one position, encoded as a `Cursor`: ``<epoch>.<id>``;
- a bucket in a Redis Cluster (one shard per partition, each with its own sequence) has one
  position per partition, encoded as a `CompositeCursor`: ``<epoch>~<id>~<id>...``, even with one
  partition (so a cursor stored by a listener of such a bucket keeps working).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from changefeed.cursor import ZERO, CompositeCursor, Cursor, StreamId, parse_cursor
from changefeed.errors import CursorError


@dataclass(frozen=True, slots=True)
class Vector:
    """Everything up to `positions[s]` of each shard s of the bucket of `epoch`."""

    epoch: str
    positions: tuple[StreamId, ...]
    composite: bool = False
    """Encoded as a `CompositeCursor` (a bucket in a Redis Cluster), else as a `Cursor`."""

    @classmethod
    def zero(cls, epoch: str, shards: int, composite: bool) -> Vector:
        return cls(epoch, (ZERO,) * shards, composite)

    def encode(self) -> str:
        if self.composite:
            return CompositeCursor(self.epoch, self.positions).encode()
        return Cursor(self.epoch, self.positions[0]).encode()

    def __str__(self) -> str:
        return self.encode()

    def covers(self, other: Vector) -> bool:
        """True when every position of `other` is at or before this one's."""
        return len(self.positions) == len(other.positions) and all(
            mine >= theirs for mine, theirs in zip(self.positions, other.positions, strict=True)
        )

    def advanced(self, shard: int, position: StreamId) -> Vector:
        """This vector with shard `shard` moved to `position` (never back)."""
        if self.positions[shard] >= position:
            return self
        positions = list(self.positions)
        positions[shard] = position
        return Vector(self.epoch, tuple(positions), self.composite)

    def with_positions(self, positions: Sequence[StreamId]) -> Vector:
        return Vector(self.epoch, tuple(positions), self.composite)


def decode_vector(text: str, shards: int, composite: bool) -> Vector:
    """The vector a cursor names, for a bucket of `shards` shards (encoded as `composite` says).

    Raises CursorError when `text` is not a cursor of such a bucket: a composite cursor given to
    an ordered bucket, a single-position one to a bucket in a Redis Cluster, a composite cursor
    of another partition count. The epoch is not checked (the caller compares it)."""
    cursor = parse_cursor(text)
    if composite:
        if not isinstance(cursor, CompositeCursor):
            raise CursorError(text, "a bucket in a Redis Cluster takes composite cursors only")
        if len(cursor.positions) != shards:
            raise CursorError(
                text, f"a composite cursor of {len(cursor.positions)} partition(s), "
                f"not of this bucket's {shards}"
            )
        return Vector(cursor.epoch, cursor.positions, True)
    if isinstance(cursor, CompositeCursor):
        raise CursorError(
            text, "the cursor is composite (of a bucket in a Redis Cluster), not of this bucket"
        )
    return Vector(cursor.epoch, (cursor.position,), False)


def parse_vector(text: str) -> Vector:
    """The vector of any cursor, composite as its text is (CursorError when it is none)."""
    cursor = parse_cursor(text)
    if isinstance(cursor, CompositeCursor):
        return Vector(cursor.epoch, cursor.positions, True)
    return Vector(cursor.epoch, (cursor.position,), False)


__all__ = ["Vector", "decode_vector", "parse_vector"]
