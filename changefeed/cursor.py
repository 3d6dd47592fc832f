"""Cursors: opaque, ordered positions in one change bucket.

A cursor names a position in the bucket's log (a Redis stream id, `ms-seq`) together with the
bucket's *epoch*, a random id created with the bucket. Cursors of one epoch sort in publish order as
plain strings; a cursor of another epoch (a bucket that was lost and created again) is *foreign*:
it is never compared with positions of the new log.

Encoding: ``<epoch>.<ms as 12 hex digits><one letter giving the length of seq><seq in hex>``, e.g.
``k2v9q4xa.0192f3a4b5c6a3`` for stream id ``1730000000454-3``. Clients must treat it as opaque.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from changefeed.errors import CursorError, CursorGone

_EPOCH_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"
_CURSOR_RE = re.compile(r"^([a-z2-7]{8,32})\.([0-9a-f]{12})([a-p])([0-9a-f]+)$")


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


@dataclass(frozen=True, slots=True)
class Cursor:
    """A position in the log of the bucket whose epoch is `epoch`."""

    epoch: str
    position: StreamId

    def encode(self) -> str:
        seq = f"{self.position.seq:x}"
        return f"{self.epoch}.{self.position.ms:012x}{chr(ord('a') + len(seq) - 1)}{seq}"

    def __str__(self) -> str:
        return self.encode()

    @staticmethod
    def run(epoch: str, ms: int, first: int, count: int) -> list[str]:
        """The encoded cursors of positions ms-first, ms-(first+1)... (`count` of them): what a
        commit of `count` changes returns, without building each Cursor."""
        head = f"{epoch}.{ms:012x}"
        out = []
        for seq in range(first, first + count):
            digits = f"{seq:x}"
            out.append(f"{head}{chr(ord('a') + len(digits) - 1)}{digits}")
        return out

    @classmethod
    def decode(cls, text: str) -> Cursor:
        if not isinstance(text, str):
            raise CursorError(repr(text), "a cursor is a string")
        match = _CURSOR_RE.match(text)
        if match is None:
            raise CursorError(text, "not a cursor issued by this change feed")
        epoch, ms, length, seq = match.groups()
        if len(seq) != ord(length) - ord("a") + 1:
            raise CursorError(text, "sequence length does not match")
        return cls(epoch, StreamId(int(ms, 16), int(seq, 16)))


def reached(delivered: str | None, wanted: Cursor) -> bool:
    """True when a listener whose last delivery (a Change, or a complete bootstrap) had cursor
    `delivered` has handed the application the change at `wanted`, or a later state of it.

    Raises CursorGone when `delivered` is of another epoch: the bucket was recreated between the
    two, and the change may have been lost with the old one (Listener.wait_for).
    """
    if delivered is None:
        return False
    have = Cursor.decode(delivered)
    if have.epoch != wanted.epoch:
        raise CursorGone(
            f"cursor {wanted} is of bucket epoch {wanted.epoch}, the listener's is {have.epoch}:"
            " the bucket was recreated; its bootstrap is the state to trust"
        )
    return have.position >= wanted.position
