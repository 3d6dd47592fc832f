"""The coalesced set of a slow listener (publisher.delivery.coalesce): one item per id, the newest
cursor, merged sub-resources, in the order of each id's newest change; bounded by ids. Pure: no
Redis, no event loop."""

from __future__ import annotations

import pytest

from changefeed.cursor import Position, StreamId
from publisher.delivery.coalesce import Coalesced, CoalesceOverflow


def at(ms: int) -> StreamId:
    return StreamId(ms, 0)


def drain(coalesced: Coalesced) -> list[tuple[str, str, tuple[str, ...], int, bool]]:
    out = []
    while coalesced:
        item, position = coalesced.pop("E")
        assert item.coalesced and item.cursor == Position.single("E", position).encode()
        assert item.published == position.ms
        out.append((item.resource, item.changed_resource_id, item.sub_resources, position.ms,
                    item.caught_up))
    return out


def test_one_item_per_id_with_the_newest_cursor_and_merged_sub_resources() -> None:
    coalesced = Coalesced(10)
    coalesced.fold("vm", ("nic",), "a", at(1))
    coalesced.fold("vm", ("alias",), "b", at(2))
    coalesced.fold("vm", ("alias", "nic"), "a", at(3))
    coalesced.fold("network", ("ips",), "a", at(4))  # same id, another resource: its own item
    coalesced.fold("vm", ("nic",), "b", at(5))
    assert len(coalesced) == 3 and coalesced.folded == 5
    assert drain(coalesced) == [
        ("vm", "a", ("nic", "alias"), 3, False),
        ("network", "a", ("ips",), 4, False),
        ("vm", "b", ("alias", "nic"), 5, True),
    ]
    assert coalesced.sent_ids == 3


def test_cursors_only_grow_while_changes_keep_arriving_during_the_drain() -> None:
    coalesced = Coalesced(10)
    for ms, id_ in enumerate("abcab", start=1):
        coalesced.fold("vm", ("nic",), id_, at(ms))
    sent = []
    item, position = coalesced.pop("E")
    sent.append((item.changed_resource_id, position.ms))  # c at 3
    coalesced.fold("vm", ("nic",), "c", at(6))  # c changed again after it was sent: pending
    coalesced.fold("vm", ("nic",), "a", at(7))  # a changed again while pending: moves last
    while coalesced:
        item, position = coalesced.pop("E")
        sent.append((item.changed_resource_id, position.ms))
    assert sent == [("c", 3), ("b", 5), ("c", 6), ("a", 7)]
    assert [ms for _, ms in sent] == sorted(ms for _, ms in sent)
    assert item.caught_up, "the last one says the catch-up is over"


def test_the_set_is_bounded_by_ids_not_items() -> None:
    coalesced = Coalesced(2)
    for ms in range(1, 1001):
        coalesced.fold("vm", ("nic",), "ab"[ms % 2], at(ms))
    assert len(coalesced) == 2 and coalesced.folded == 1000
    with pytest.raises(CoalesceOverflow):
        coalesced.fold("vm", ("nic",), "c", at(1001))
    assert len(coalesced) == 2, "the id that did not fit was not kept"
    coalesced.pop("E")
    coalesced.fold("vm", ("nic",), "c", at(1002))  # room again
    assert len(coalesced) == 2


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        Coalesced(0)


def test_popping_an_empty_set_raises() -> None:
    with pytest.raises(StopIteration):
        Coalesced(1).pop("E")
