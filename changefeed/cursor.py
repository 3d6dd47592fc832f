"""Cursors: opaque, ordered positions in one change bucket, and `Position`, the one type that
holds them.

A cursor names a position in the bucket's log (a Redis stream id, `ms-seq`) together with the
bucket's *epoch*, a random id created with the bucket. Cursors of one epoch sort in publish order as
plain strings; a cursor of another epoch (a bucket that was lost and created again) is *foreign*:
it is never compared with positions of the new log.

Encoding: ``<epoch>.<ms as 12 hex digits><one letter giving the length of seq><seq in hex>``, e.g.
``k2v7q4xa.0192cc0915c6a3`` for stream id ``1730000000454-3``. Clients must treat it as opaque.

A bucket in a Redis Cluster has one log per partition, each with its own sequence, so its
positions are *composite* (`Position.composite`; `CompositeCursor` is a name of `Position`): the
epoch and one position per partition, ``<epoch>~<position of partition 0>~<position of partition
1>...``, each position written as above after the epoch's dot (``0192cc0915c6a3``) and empty for
0-0 (nothing of that partition).

One type holds both kinds: `Position` (the epoch, one position per log, and which encoding it is
written in). `Position.decode` reads either encoding (the ``~`` tells them apart) and `encode`
writes the one it was read from. Composite cursors are ordered partially: one is at or after
another when each of its positions is (`Position.covers`, which orders single ones too).
`Cursor` is the old name of `Position`.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from changefeed.errors import CursorError, CursorGone

_EPOCH_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"
_CURSOR_RE = re.compile(r"([a-z2-7]{8,32})\.([0-9a-f]{12})([a-p])([0-9a-f]+)")
_POSITION_RE = re.compile(r"([0-9a-f]{12})([a-p])([0-9a-f]+)")
_EPOCH_RE = re.compile(r"[a-z2-7]{8,32}")
COMPOSITE_SEPARATOR = "~"
MAX_PARTITIONS = 1024
"""Most partitions a composite cursor carries (bucket.partitions is bounded by it too)."""


@dataclass(frozen=True, order=True, slots=True)
class StreamId:
    """A Redis stream entry id."""

    ms: int
    seq: int

    @classmethod
    def parse(cls, text: str | bytes) -> StreamId:
        if isinstance(text, bytes):
            text = text.decode()
        ms, _, seq = text.partition("-")
        return cls(int(ms), int(seq or 0))

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq}"


ZERO = StreamId(0, 0)


def new_epoch() -> str:
    """A fresh random epoch id (10 base32 characters, 50 bits)."""
    return "".join(secrets.choice(_EPOCH_ALPHABET) for _ in range(10))


def _encode_id(position: StreamId) -> str:
    seq = f"{position.seq:x}"
    return f"{position.ms:012x}{chr(ord('a') + len(seq) - 1)}{seq}"


def _encode_position(position: StreamId) -> str:
    """A composite cursor's piece: empty for ZERO (nothing of that partition)."""
    return "" if position == ZERO else _encode_id(position)


def _decode_position(text: str, whole: str) -> StreamId:
    if not text:
        return ZERO
    match = _POSITION_RE.fullmatch(text)
    if match is None:
        raise CursorError(whole, "not a cursor issued by this change feed")
    ms, length, seq = match.groups()
    if len(seq) != ord(length) - ord("a") + 1:
        raise CursorError(whole, "sequence length does not match")
    return StreamId(int(ms, 16), int(seq, 16))


@dataclass(frozen=True, slots=True, init=False)
class Position:
    """A position in every log of a bucket, with the bucket's epoch: everything up to
    `positions[s]` of log s (ZERO: nothing of it). The one position type of the tree: a
    bucket's head, what a cursor names, the window's place, a composite cursor.

    `composite`: encoded as a composite cursor (a bucket in a Redis Cluster, one log per
    partition: ``<epoch>~<p0>~<p1>...``, even with one partition); else the bucket has one
    total order and one position (`single`, `position`), encoded ``<epoch>.<id>``.

    ``Position(epoch, positions)`` is composite unless `composite` says otherwise.
    ``Position(epoch, stream_id)`` — one stream id rather than a tuple — is the single position
    `Position.single(epoch, stream_id)`: the constructor of `Cursor`, this type's old name.
    """

    epoch: str
    positions: tuple[StreamId, ...]
    composite: bool

    def __init__(
        self, epoch: str, positions: tuple[StreamId, ...] | StreamId,
        composite: bool | None = None,
    ) -> None:
        if isinstance(positions, StreamId):
            positions, composite = (positions,), bool(composite)
        object.__setattr__(self, "epoch", epoch)
        object.__setattr__(self, "positions", positions)
        object.__setattr__(self, "composite", True if composite is None else composite)

    @classmethod
    def single(cls, epoch: str, position: StreamId) -> Position:
        """The one position of a bucket with one total order (encoded ``<epoch>.<id>``)."""
        return cls(epoch, (position,), False)

    @classmethod
    def zero(cls, epoch: str, logs: int, composite: bool) -> Position:
        return cls(epoch, (ZERO,) * logs, composite)

    @property
    def position(self) -> StreamId:
        """The position of a one-log Position (a single cursor's); ValueError when there are
        several logs."""
        if len(self.positions) != 1:
            raise ValueError(f"a position in {len(self.positions)} logs has no single position")
        return self.positions[0]

    def encode(self) -> str:
        if not self.composite:
            return f"{self.epoch}.{_encode_id(self.positions[0])}"
        return COMPOSITE_SEPARATOR.join(
            [self.epoch, *(_encode_position(p) for p in self.positions)]
        )

    def __str__(self) -> str:
        return self.encode()

    @classmethod
    def decode(cls, text: str) -> Position:
        """The position a cursor names, of either encoding (the ``~`` tells them apart): a
        single cursor ``<epoch>.<id>`` (not `composite`, one position) or a composite one
        ``<epoch>~<p0>~<p1>...``. CursorError when `text` is neither."""
        if not isinstance(text, str):
            raise CursorError(repr(text), "a cursor is a string")
        if COMPOSITE_SEPARATOR not in text:
            match = _CURSOR_RE.fullmatch(text)
            if match is None:
                raise CursorError(text, "not a cursor issued by this change feed")
            epoch, ms, length, seq = match.groups()
            if len(seq) != ord(length) - ord("a") + 1:
                raise CursorError(text, "sequence length does not match")
            return cls(epoch, (StreamId(int(ms, 16), int(seq, 16)),), False)
        epoch, *positions = text.split(COMPOSITE_SEPARATOR)
        if _EPOCH_RE.fullmatch(epoch) is None:
            raise CursorError(text, "not a cursor issued by this change feed")
        if len(positions) > MAX_PARTITIONS:
            raise CursorError(text, f"more than {MAX_PARTITIONS} partitions")
        return cls(epoch, tuple(_decode_position(p, text) for p in positions), True)

    @classmethod
    def decode_single(cls, text: str) -> Position:
        """The single cursor ``<epoch>.<id>`` `text`, where one total order is meant (a
        per-partition cursor of the feed, a durable consumer's start): CursorError for
        anything else, a composite cursor too."""
        if isinstance(text, str) and COMPOSITE_SEPARATOR in text:
            raise CursorError(text, "not a cursor issued by this change feed")
        return cls.decode(text)

    @staticmethod
    def run(epoch: str, ms: int, first: int, count: int) -> list[str]:
        """The encoded single cursors of positions ms-first, ms-(first+1)... (`count` of them):
        what a commit of `count` changes to a bucket with one total order returns, without
        building each Position."""
        head = f"{epoch}.{ms:012x}"
        out: list[str] = []
        seq, end = first, first + count
        while seq < end:  # one run of sequence numbers of as many hex digits at a time
            digits = len(f"{seq:x}")
            stop = min(end, 16**digits)
            prefix = f"{head}{chr(ord('a') + digits - 1)}"
            out += [f"{prefix}{s:x}" for s in range(seq, stop)]
            seq = stop
        return out

    @staticmethod
    def at(epoch: str, partitions: int, partition: int, position: StreamId) -> str:
        """The encoded composite cursor of one position of one partition (nothing of the
        others): what a commit to a bucket in a Redis Cluster returns for a change, and what
        `covers` compares with."""
        pieces = [""] * partitions
        pieces[partition] = _encode_position(position)
        return COMPOSITE_SEPARATOR.join([epoch, *pieces])

    def covers(self, other: Position) -> bool:
        """True when every position of `other` is at or before this one's (same logs)."""
        return len(self.positions) == len(other.positions) and all(
            mine >= theirs for mine, theirs in zip(self.positions, other.positions, strict=True)
        )

    def advanced(self, log: int, position: StreamId) -> Position:
        """This position with log `log` moved to `position` (never back)."""
        if self.positions[log] >= position:
            return self
        positions = list(self.positions)
        positions[log] = position
        return Position(self.epoch, tuple(positions), self.composite)

    def with_positions(self, positions: Sequence[StreamId]) -> Position:
        return Position(self.epoch, tuple(positions), self.composite)


Cursor = Position
"""The old name of `Position` (exported by `publisher` and `changefeed`): ``Cursor(epoch,
stream_id)``, ``Cursor.decode(text)``, ``.epoch``, ``.position``, ``.encode()`` and
``Cursor.run`` keep working, and give a `Position`."""

CompositeCursor = Position
"""A composite cursor: a `Position` of a bucket in a Redis Cluster (`composite`, the default)."""


def is_composite(text: str) -> bool:
    """True when `text` is (meant as) a composite cursor rather than a single position."""
    return isinstance(text, str) and COMPOSITE_SEPARATOR in text


def reached(delivered: str | None, wanted: Position) -> bool:
    """True when a listener whose last delivery (a Change, or a complete bootstrap) had cursor
    `delivered` has handed the application the change at `wanted`, or a later state of it.

    Raises CursorGone when `delivered` is of another epoch: the bucket was recreated between the
    two, and the change may have been lost with the old one (Listener.wait_for).
    """
    if delivered is None:
        return False
    have = Position.decode(delivered)
    if have.epoch != wanted.epoch:
        raise CursorGone(
            f"cursor {wanted} is of bucket epoch {wanted.epoch}, the listener's is {have.epoch}:"
            " the bucket was recreated; its bootstrap is the state to trust"
        )
    if have.composite != wanted.composite:
        raise CursorError(str(wanted), "a cursor of the other kind than the listener's "
                          "(composite cursors belong to buckets in a Redis Cluster)")
    if len(have.positions) != len(wanted.positions):
        raise CursorError(
            str(wanted), f"a cursor of {len(wanted.positions)} partitions, the listener's has "
            f"{len(have.positions)}"
        )
    return have.covers(wanted)
