"""Positions (`changefeed.cursor.Position`, the one position type): composite cursors (a
position per partition, for buckets in a Redis Cluster) and an ordered bucket's one position,
round trips, telling them from single-position cursors, their partial order, `reached`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from changefeed.cursor import (
    ZERO,
    CompositeCursor,
    Cursor,
    Position,
    StreamId,
    is_composite,
    new_epoch,
    parse_cursor,
    reached,
)
from changefeed.errors import CursorError, CursorGone

positions = st.builds(
    StreamId, st.integers(0, (1 << 48) - 1), st.integers(0, (1 << 64) - 1)
)
epochs = st.text("abcdefghijklmnopqrstuvwxyz234567", min_size=8, max_size=32)


@given(epochs, st.lists(positions, min_size=1, max_size=16))
def test_a_composite_cursor_round_trips(epoch: str, at: list[StreamId]) -> None:
    cursor = CompositeCursor(epoch, tuple(at))
    text = cursor.encode()
    assert is_composite(text)
    assert CompositeCursor.decode(text) == cursor
    assert parse_cursor(text) == cursor


@given(epochs, positions)
def test_single_cursors_are_never_taken_for_composite_ones(epoch: str, at: StreamId) -> None:
    text = Cursor(epoch, at).encode()
    assert not is_composite(text)
    assert parse_cursor(text) == Cursor(epoch, at)
    with pytest.raises(CursorError):
        CompositeCursor.decode(text)


def test_zero_positions_are_empty_and_at_names_one_partition() -> None:
    epoch = new_epoch()
    text = CompositeCursor.at(epoch, 3, 1, StreamId(1_730_000_000_454, 3))
    single = Cursor(epoch, StreamId(1_730_000_000_454, 3)).encode()
    assert text == f"{epoch}~~{single.partition('.')[2]}~"
    assert CompositeCursor.decode(text).positions == (ZERO, StreamId(1_730_000_000_454, 3), ZERO)


def test_covers_is_each_position_at_or_after() -> None:
    epoch = new_epoch()
    a = CompositeCursor(epoch, (StreamId(5, 0), StreamId(7, 1)))
    assert a.covers(a)
    assert a.covers(CompositeCursor(epoch, (StreamId(5, 0), ZERO)))
    assert not a.covers(CompositeCursor(epoch, (StreamId(5, 1), ZERO)))
    assert not a.covers(CompositeCursor(epoch, (ZERO, ZERO, ZERO)))
    assert a.advanced(1, StreamId(8, 0)).positions == (StreamId(5, 0), StreamId(8, 0))
    assert a.advanced(1, StreamId(1, 0)) is a


@pytest.mark.parametrize(
    "text",
    [
        "~",  # no epoch
        "k2v9q4xa",  # neither kind
        "k2v9q4xa~zz",  # a position that is not one
        "k2v9q4xa~0192f3a4b5c6b3",  # sequence length does not match
        "K2V9Q4XA~",  # epoch alphabet
        "k2v9q4xa~" + "~" * 1024,  # too many partitions
    ],
)
def test_malformed_composite_cursors_are_refused(text: str) -> None:
    with pytest.raises(CursorError):
        parse_cursor(text)


def test_reached_compares_every_partition() -> None:
    epoch = new_epoch()
    delivered = CompositeCursor(epoch, (StreamId(9, 0), StreamId(3, 0))).encode()
    def at(partition: int, position: StreamId) -> CompositeCursor:
        return CompositeCursor.decode(CompositeCursor.at(epoch, 2, partition, position))

    assert reached(delivered, at(1, StreamId(3, 0)))
    assert not reached(delivered, at(1, StreamId(3, 1)))
    assert not reached(None, CompositeCursor(epoch, (ZERO, ZERO)))
    with pytest.raises(CursorGone):
        reached(delivered, CompositeCursor(new_epoch(), (ZERO, ZERO)))
    with pytest.raises(CursorError):
        reached(delivered, Cursor(epoch, StreamId(1, 0)))
    with pytest.raises(CursorError):
        reached(delivered, CompositeCursor(epoch, (ZERO, ZERO, ZERO)))


def test_one_type_is_the_composite_cursor_the_bucket_vector_and_an_ordered_position() -> None:
    from publisher.bucket import Vector, decode_vector, parse_vector

    assert CompositeCursor is Position and Vector is Position
    epoch = new_epoch()
    ordered = Position(epoch, (StreamId(5, 1),), False)
    assert ordered.encode() == Cursor(epoch, StreamId(5, 1)).encode()
    assert parse_vector(ordered.encode()) == ordered
    assert decode_vector(ordered.encode(), 1, False) == ordered
    composite = Position(epoch, (StreamId(5, 1),))
    single = Cursor(epoch, StreamId(5, 1)).encode()
    assert composite.composite and composite.encode() == f"{epoch}~" + single.split(".")[1]
    assert parse_cursor(composite.encode()) == composite == parse_vector(composite.encode())
    # covers and advanced are written once, for both kinds
    for kind in (False, True):
        at = Position(epoch, (StreamId(5, 1),), kind)
        assert at.advanced(0, StreamId(4, 0)) is at
        ahead = at.advanced(0, StreamId(6, 0))
        assert ahead.composite is kind and ahead.positions == (StreamId(6, 0),)
        assert ahead.covers(at) and not at.covers(ahead)
    with pytest.raises(CursorError):
        decode_vector(composite.encode(), 1, False)
    with pytest.raises(CursorError):
        decode_vector(ordered.encode(), 1, True)
