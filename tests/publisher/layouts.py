"""Helpers of the tests that run on both layouts (`layout`, `layout_config` in tests/conftest.py):
one Redis (an ordered bucket, one shard, cursors `<epoch>.<id>`) and the session's 3-master Redis
Cluster (a shard per partition, composite cursors)."""

from __future__ import annotations

from typing import Any

from changefeed.cursor import Position, StreamId
from publisher.bucket import Change, Vector, partition_of
from publisher.server.service import Service

PARTITIONS = 4


def own(cursor: str, changed_id: str) -> tuple[int, StreamId]:
    """An item's own position: (its shard, its position there). A cursor stamped on an item
    holds, in the item's shard, the item's own position."""
    vector = Position.decode(cursor)
    shard = partition_of(changed_id, PARTITIONS) if vector.composite else 0
    return shard, vector.positions[shard]


async def commit(
    service: Service, prefix: str, n: int, subs: tuple[str, ...] = ("nic",)
) -> dict[str, str]:
    """Commit `n` changes of ids `<prefix>-<i>` in one call; their cursors by id."""
    ids = [f"{prefix}-{i}" for i in range(n)]
    cursors = await service.bucket.commit_many(
        Change.put("vm", id, list(subs), {"uuid": id}) for id in ids
    )
    return dict(zip(ids, cursors, strict=True))


def owns(items: list[dict[str, Any]]) -> list[tuple[int, StreamId]]:
    """The own positions of received items, in order."""
    return [own(i["cursor"], i["changedResourceId"]) for i in items]


def check_order(items: list[dict[str, Any]]) -> None:
    """Each item's cursor never goes back in any shard, and moves the item's own shard."""
    before: Vector | None = None
    for item in items:
        cursor = Position.decode(item["cursor"])
        if before is not None:
            assert cursor.covers(before)
            shard, position = own(item["cursor"], item["changedResourceId"])
            assert position > before.positions[shard]
        before = cursor


def by_commit_order(ids: list[str]) -> bool:
    """True when, in each partition, `ids` (`<prefix>-<n>`, committed in that order per prefix
    and prefixes in alphabetical order) come in commit order."""
    for p in range(PARTITIONS):
        of_p = [i for i in ids if partition_of(i, PARTITIONS) == p]
        if of_p != sorted(of_p, key=lambda i: (i.split("-")[0], int(i.split("-")[1]))):
            return False
    return True


__all__ = ["PARTITIONS", "by_commit_order", "check_order", "commit", "own", "owns"]
