"""Cursors: encoding round trips of both kinds, string order equals log order, one decode for
both encodings, malformed cursors refused, and `Cursor`, the old name of `Position`."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from changefeed.cursor import ZERO, Cursor, Position, StreamId, new_epoch
from changefeed.errors import CursorError

ids = st.builds(StreamId, st.integers(0, (1 << 48) - 1), st.integers(0, (1 << 64) - 1))
epochs = st.text("abcdefghijklmnopqrstuvwxyz234567", min_size=8, max_size=32)
singles = st.builds(Position.single, epochs, ids)
composites = st.builds(
    lambda epoch, at: Position(epoch, tuple(at), True), epochs, st.lists(ids, min_size=1,
                                                                          max_size=16)
)


def test_a_cursor_round_trips_and_sorts_as_its_position() -> None:
    rng = random.Random(7)
    epoch = new_epoch()
    positions = sorted(
        {StreamId(rng.randrange(0, 1 << 44), rng.randrange(0, 1 << rng.randrange(1, 60)))
         for _ in range(2000)}
    )
    encoded = [Position.single(epoch, p).encode() for p in positions]
    assert [Position.decode(text).position for text in encoded] == positions
    assert sorted(encoded) == encoded, "cursors of one epoch sort as their positions"


@given(st.one_of(singles, composites))
def test_decode_reads_what_encode_writes_of_either_kind(position: Position) -> None:
    text = position.encode()
    assert ("~" in text) is position.composite
    assert Position.decode(text) == position
    assert str(position) == text


@given(epochs, ids)
def test_a_single_cursor_is_one_position_not_composite(epoch: str, at: StreamId) -> None:
    text = Position.single(epoch, at).encode()
    assert text.startswith(f"{epoch}.")
    decoded = Position.decode(text)
    assert decoded == Position.decode_single(text) == Position(epoch, (at,), False)
    assert not decoded.composite and decoded.positions == (at,) and decoded.position == at


@given(st.text("abcdefghijklmnopqrstuvwxyz234567.~0123456789\n -", max_size=40))
def test_decode_refuses_any_other_text_with_a_cursor_error(text: str) -> None:
    """Whatever the text, decode gives a Position that encodes back to the same Position, or a
    CursorError naming the text: never another exception."""
    try:
        position = Position.decode(text)
    except CursorError as exc:
        assert exc.cursor == text
    else:
        assert Position.decode(position.encode()) == position
        assert "\n" not in text and " " not in text


def test_run_equals_cursors_built_one_by_one() -> None:
    epoch = new_epoch()
    run = Position.run(epoch, 1_730_000_000_454, 14, 5)
    assert run == [Position.single(epoch, StreamId(1_730_000_000_454, s)).encode()
                   for s in range(14, 19)]
    assert Position.run(epoch, 5, 0, 0) == []
    # The seq's length letter changes inside a run (0xf -> 0x10).
    assert [Position.decode(c).position for c in Position.run(epoch, 5, 14, 4)] == [
        StreamId(5, s) for s in range(14, 18)
    ]
    # Across the sequence numbers' changes of length (15 -> 16, 4095 -> 4096), and none.
    for first, count in [(0, 300), (4090, 20), (2**40 - 3, 9), (7, 0)]:
        assert Position.run(epoch, 5, first, count) == [
            Position.single(epoch, StreamId(5, s)).encode() for s in range(first, first + count)]


def test_stream_ids() -> None:
    assert StreamId.parse(b"1730000000454-3") == StreamId(1_730_000_000_454, 3)
    assert StreamId.parse("17") == StreamId(17, 0)
    assert str(StreamId(5, 2)) == "5-2" and ZERO < StreamId(0, 1) < StreamId(1, 0)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "not a cursor issued by this change feed"),
        ("k2v7q4xa", "not a cursor issued by this change feed"),
        ("K2V9Q4XA.0192f3a4b5c6a3", "not a cursor issued by this change feed"),  # lower-case
        ("k2v7q4xa.0192f3a4b5c6b3", "sequence length does not match"),
        ("k2v7q4xa.0192f3a4b5c6a3 ", "not a cursor issued by this change feed"),
        ("k2v7q4xa.0192f3a4b5c6a3\n", "not a cursor issued by this change feed"),
        ("k2v7q4xa.0192f3a4b5c6a٣", "not a cursor issued by this change feed"),  # non-ASCII
        ("k2v7q4xa.0192f3a4b5c6a3.", "not a cursor issued by this change feed"),
        ("~", "not a cursor issued by this change feed"),  # no epoch
        ("k2v7q4xa~zz", "not a cursor issued by this change feed"),
        ("k2v7q4xa~0192f3a4b5c6b3", "sequence length does not match"),
        ("K2V9Q4XA~", "not a cursor issued by this change feed"),
        ("k2v7q4xa\n~", "not a cursor issued by this change feed"),
        ("k2v7q4xa~0192f3a4b5c6a3\n", "not a cursor issued by this change feed"),
        ("k2v7q4xa.0192f3a4b5c6a3~", "not a cursor issued by this change feed"),
        ("k2v7q4xa~" + "~" * 1024, "more than 1024 partitions"),
    ],
)
def test_malformed_cursors_are_refused(text: str, why: str) -> None:
    with pytest.raises(CursorError, match=why) as caught:
        Position.decode(text)
    assert caught.value.cursor == text


def test_decode_single_refuses_a_composite_cursor_as_no_cursor() -> None:
    """Where one total order is meant (a feed partition's cursor, a durable consumer's start) a
    composite cursor is refused with the same words as any other text."""
    epoch = new_epoch()
    composite = Position(epoch, (StreamId(5, 1),)).encode()
    assert Position.decode(composite).composite
    with pytest.raises(CursorError, match="not a cursor issued by this change feed"):
        Position.decode_single(composite)
    with pytest.raises(CursorError, match="sequence length does not match"):
        Position.decode_single(f"{epoch}.0192f3a4b5c6b3")


def test_a_cursor_must_be_a_string() -> None:
    for decode in (Position.decode, Position.decode_single):
        with pytest.raises(CursorError, match="a string"):
            decode(42)  # type: ignore[arg-type]


def test_position_is_the_one_position_of_a_single_log_only() -> None:
    epoch = new_epoch()
    assert Position(epoch, (StreamId(3, 0),)).position == StreamId(3, 0)  # composite, one log
    with pytest.raises(ValueError, match="2 logs"):
        _ = Position(epoch, (ZERO, ZERO)).position


def test_cursor_is_the_old_name_of_position_and_builds_as_it_did() -> None:
    import changefeed
    import publisher

    assert Cursor is Position is changefeed.Cursor is publisher.Cursor
    epoch = new_epoch()
    old = Cursor(epoch, StreamId(1_730_000_000_454, 3))
    assert old == Position.single(epoch, StreamId(1_730_000_000_454, 3))
    assert (old.epoch, old.position, old.composite) == (epoch, StreamId(1_730_000_000_454, 3),
                                                        False)
    assert old.encode() == f"{epoch}.0192cc0915c6a3"
    assert Cursor.decode(old.encode()) == old and Cursor.decode(old.encode()).position.seq == 3
    assert Cursor.run(epoch, 1_730_000_000_454, 3, 1) == [old.encode()]
    # One stream id with composite=True is a composite cursor of one partition.
    one = Position(epoch, StreamId(5, 1), True)
    assert one.composite and one.positions == (StreamId(5, 1),) and "~" in one.encode()
