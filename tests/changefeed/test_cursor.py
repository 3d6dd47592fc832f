"""Cursors: encoding round trips, string order equals log order, malformed cursors refused."""

from __future__ import annotations

import random

import pytest

from changefeed.cursor import ZERO, Cursor, StreamId, new_epoch
from changefeed.errors import CursorError


def test_a_cursor_round_trips_and_sorts_as_its_position() -> None:
    rng = random.Random(7)
    epoch = new_epoch()
    positions = sorted(
        {StreamId(rng.randrange(0, 1 << 44), rng.randrange(0, 1 << rng.randrange(1, 60)))
         for _ in range(2000)}
    )
    encoded = [Cursor(epoch, p).encode() for p in positions]
    assert [Cursor.decode(text).position for text in encoded] == positions
    assert sorted(encoded) == encoded, "cursors of one epoch sort as their positions"


def test_run_equals_cursors_built_one_by_one() -> None:
    epoch = new_epoch()
    run = Cursor.run(epoch, 1_730_000_000_454, 14, 5)
    assert run == [Cursor(epoch, StreamId(1_730_000_000_454, s)).encode() for s in range(14, 19)]
    # Across the sequence numbers' changes of length (15 -> 16, 4095 -> 4096), and none.
    for first, count in [(0, 300), (4090, 20), (2**40 - 3, 9), (7, 0)]:
        assert Cursor.run(epoch, 5, first, count) == [
            Cursor(epoch, StreamId(5, s)).encode() for s in range(first, first + count)]


def test_stream_ids() -> None:
    assert StreamId.parse(b"1730000000454-3") == StreamId(1_730_000_000_454, 3)
    assert StreamId.parse("17") == StreamId(17, 0)
    assert str(StreamId(5, 2)) == "5-2" and ZERO < StreamId(0, 1) < StreamId(1, 0)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "not a cursor"),
        ("k2v7q4xa", "not a cursor"),
        ("K2V9Q4XA.0192f3a4b5c6a3", "not a cursor"),  # epochs are lower-case base32
        ("k2v7q4xa.0192f3a4b5c6b3", "sequence length"),
        ("k2v7q4xa.0192f3a4b5c6a3 ", "not a cursor"),
        ("k2v7q4xa.0192f3a4b5c6a٣", "not a cursor"),  # a non-ASCII digit
    ],
)
def test_malformed_cursors_are_refused(text: str, why: str) -> None:
    with pytest.raises(CursorError, match=why) as caught:
        Cursor.decode(text)
    assert caught.value.cursor == text


def test_a_cursor_must_be_a_string() -> None:
    with pytest.raises(CursorError, match="a string"):
        Cursor.decode(42)  # type: ignore[arg-type]
