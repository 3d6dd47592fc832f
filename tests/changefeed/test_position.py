"""Positions (`changefeed.cursor.Position`, the one position type): composite cursors (a
position per partition, for buckets in a Redis Cluster) and an ordered bucket's one position,
round trips, telling them from single-position cursors, their partial order, `reached`, and the
bucket's `decode_vector`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from changefeed.cursor import (
    ZERO,
    CompositeCursor,
    Position,
    StreamId,
    is_composite,
    new_epoch,
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
    assert Position.decode(text) == cursor and cursor.composite


@given(epochs, positions)
def test_single_cursors_are_never_taken_for_composite_ones(epoch: str, at: StreamId) -> None:
    text = Position.single(epoch, at).encode()
    assert not is_composite(text)
    assert Position.decode(text) == Position.single(epoch, at)
    assert not Position.decode(text).composite


def test_zero_positions_are_empty_and_at_names_one_partition() -> None:
    epoch = new_epoch()
    text = CompositeCursor.at(epoch, 3, 1, StreamId(1_730_000_000_454, 3))
    single = Position.single(epoch, StreamId(1_730_000_000_454, 3)).encode()
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
        "k2v7q4xa",  # neither kind
        "k2v7q4xa~zz",  # a position that is not one
        "k2v7q4xa~0192f3a4b5c6b3",  # sequence length does not match
        "K2V9Q4XA~",  # epoch alphabet
        "k2v7q4xa~" + "~" * 1024,  # too many partitions
    ],
)
def test_malformed_composite_cursors_are_refused(text: str) -> None:
    with pytest.raises(CursorError):
        Position.decode(text)


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
    with pytest.raises(CursorError, match="other kind than the listener's"):
        reached(delivered, Position.single(epoch, StreamId(1, 0)))
    with pytest.raises(CursorError, match="of 3 partitions, the listener's has 2"):
        reached(delivered, CompositeCursor(epoch, (ZERO, ZERO, ZERO)))


def test_reached_compares_a_single_position() -> None:
    epoch = new_epoch()
    delivered = Position.single(epoch, StreamId(9, 2)).encode()
    assert reached(delivered, Position.single(epoch, StreamId(9, 2)))
    assert reached(delivered, Position.single(epoch, StreamId(9, 1)))
    assert not reached(delivered, Position.single(epoch, StreamId(9, 3)))
    with pytest.raises(CursorGone, match="the bucket was recreated"):
        reached(delivered, Position.single(new_epoch(), StreamId(1, 0)))
    with pytest.raises(CursorError, match="other kind than the listener's"):
        reached(delivered, Position(epoch, (StreamId(1, 0),)))
    with pytest.raises(CursorError, match="not a cursor issued"):
        reached("garbage", Position.single(epoch, StreamId(1, 0)))


def test_one_type_is_the_composite_cursor_the_bucket_vector_and_an_ordered_position() -> None:
    from publisher.bucket import Vector, decode_vector

    assert CompositeCursor is Position and Vector is Position
    epoch = new_epoch()
    ordered = Position(epoch, (StreamId(5, 1),), False)
    assert ordered == Position.single(epoch, StreamId(5, 1))
    assert Position.decode(ordered.encode()) == ordered
    assert decode_vector(ordered.encode(), 1, False) == ordered
    composite = Position(epoch, (StreamId(5, 1),))
    single = ordered.encode()
    assert composite.composite and composite.encode() == f"{epoch}~" + single.split(".")[1]
    assert Position.decode(composite.encode()) == composite
    # covers and advanced are written once, for both kinds
    for kind in (False, True):
        at = Position(epoch, (StreamId(5, 1),), kind)
        assert at.advanced(0, StreamId(4, 0)) is at
        ahead = at.advanced(0, StreamId(6, 0))
        assert ahead.composite is kind and ahead.positions == (StreamId(6, 0),)
        assert ahead.covers(at) and not at.covers(ahead)
    with pytest.raises(CursorError, match=r"the cursor is composite \(of a bucket in a Redis"):
        decode_vector(composite.encode(), 1, False)
    with pytest.raises(CursorError, match="a bucket in a Redis Cluster takes composite cursors"):
        decode_vector(ordered.encode(), 1, True)
    with pytest.raises(CursorError, match=r"a composite cursor of 1 partition\(s\), not "
                       "of this bucket's 3"):
        decode_vector(composite.encode(), 3, True)
    with pytest.raises(CursorError, match="not a cursor issued"):
        decode_vector("garbage", 1, False)
    assert decode_vector(Position(epoch, (ZERO, ZERO, ZERO)).encode(), 3, True).positions == (
        ZERO, ZERO, ZERO)
