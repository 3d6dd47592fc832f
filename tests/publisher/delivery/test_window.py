"""The fan-out window: a bounded run of the newest entries, what it covers, what is after a
position (pure: no Redis, no event loop)."""

from __future__ import annotations

import pytest

from changefeed.cursor import ZERO, StreamId
from publisher.delivery.window import Window, WindowEntry


def entry(ms: int) -> WindowEntry:
    return WindowEntry(StreamId(ms, 0), "vm", ("nic",), f"vm-{ms}", b"{}", b"frame")


def positions(entries: list[WindowEntry]) -> list[int]:
    return [e.position.ms for e in entries]


def test_the_window_keeps_the_newest_capacity_entries() -> None:
    window = Window(3, ZERO)
    for ms in range(1, 11):
        window.append(entry(ms))
        assert len(window) == min(ms, 3)
        assert window.head == StreamId(ms, 0)
    assert window.base == StreamId(7, 0), "covers (base, head]: 8, 9, 10"
    assert positions(window.after(ZERO)) == [8, 9, 10]
    assert positions(window.after(StreamId(8, 0))) == [9, 10]
    assert window.after(StreamId(10, 0)) == []
    assert window.behind(StreamId(8, 0)) == 2


def test_what_the_window_covers() -> None:
    window = Window(2, StreamId(5, 0))
    assert window.covers(StreamId(5, 0)) and not window.covers(StreamId(4, 9))
    for ms in (6, 7, 8):
        window.append(entry(ms))
    assert not window.covers(StreamId(5, 0)), "6 fell out: a position at 5 would miss it"
    assert window.covers(StreamId(6, 0)) and window.covers(StreamId(8, 0))
    assert window.covers(StreamId(9, 0)), "ahead of the head: nothing after it is missing yet"


def test_entries_are_appended_in_order_and_reset_forgets_them() -> None:
    window = Window(4, ZERO)
    window.append(entry(3))
    with pytest.raises(ValueError, match="in order"):
        window.append(entry(3))
    window.reset(StreamId(100, 0))
    assert len(window) == 0 and window.base == window.head == StreamId(100, 0)
    assert window.after(ZERO) == []
    with pytest.raises(ValueError, match="capacity"):
        Window(0, ZERO)


def test_oldest_is_the_entry_the_next_append_drops_when_full() -> None:
    window = Window(2, ZERO)
    assert window.oldest() is None
    for ms in (1, 2, 3):
        window.append(entry(ms))
    oldest = window.oldest()
    assert oldest is not None and oldest.position == StreamId(2, 0)
    window.append(entry(4))
    assert not window.covers(StreamId(1, 9)) and window.base == StreamId(2, 0)
