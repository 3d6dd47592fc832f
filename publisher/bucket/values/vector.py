"""A position in every shard of a bucket, as a cursor names it: `Vector`, the one position type
(`changefeed.cursor.Position`) under the bucket's name, and the decoding of a cursor for a
bucket of a given layout. Pure code.

A bucket is a set of shards, each a log with one id sequence (`publisher.bucket.log.shard`). A
position in the bucket is one stream id per shard, with the bucket's epoch. On the wire:

- an ordered bucket (a single Redis or Sentinel: one shard, its partitions sharing one id
  sequence) has one position, encoded as a single cursor: ``<epoch>.<id>``;
- a bucket in a Redis Cluster (one shard per partition, each with its own sequence) has one
  position per partition, encoded as a composite cursor: ``<epoch>~<id>~<id>...``, even with one
  partition (so a cursor stored by a listener of such a bucket keeps working).
"""

from __future__ import annotations

from changefeed.cursor import Position
from changefeed.errors import CursorError

Vector = Position
"""A position in every shard of a bucket (`changefeed.cursor.Position`)."""


def decode_vector(text: str, shards: int, composite: bool) -> Vector:
    """The vector a cursor names, for a bucket of `shards` shards (encoded as `composite` says).

    Raises CursorError when `text` is not a cursor of such a bucket: a composite cursor given to
    an ordered bucket, a single-position one to a bucket in a Redis Cluster, a composite cursor
    of another partition count. The epoch is not checked (the caller compares it)."""
    vector = Position.decode(text)
    if vector.composite != composite:
        raise CursorError(text, _OTHER_KIND[composite])
    if len(vector.positions) != shards:
        raise CursorError(
            text, f"a composite cursor of {len(vector.positions)} partition(s), "
            f"not of this bucket's {shards}"
        )
    return vector


_OTHER_KIND = {
    True: "a bucket in a Redis Cluster takes composite cursors only",
    False: "the cursor is composite (of a bucket in a Redis Cluster), not of this bucket",
}

__all__ = ["Vector", "decode_vector"]
