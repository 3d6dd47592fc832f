"""Coalesced catch-up on both layouts (one Redis, the 3-master Redis Cluster): `coalesceIds` from
config.js applies from the start, and a coalescing listener whose connection is killed in the
middle of its coalesced catch-up resumes from the last coalesced cursor it got, exactly: every
change is delivered (or merged into a later item of its id), and none twice.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from changefeed.cursor import Position
from publisher.bucket import partition_of
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.publisher.delivery.test_coalesce_slow import (
    BATCH,
    LIMITS,
    MAX_ITEMS,
    Reader,
    _commit,
    _conn,
)
from tests.publisher.delivery.test_hub import RawListener
from tests.wsclient import register, v1

PARTITIONS = 4


def own(cursor: str, changed_id: str) -> tuple[int, Any]:
    """The item's own position: (its partition's shard, its position there). A composite
    cursor stamped on an item holds, in the item's shard, the item's own position."""
    vector = Position.decode(cursor)
    shard = partition_of(changed_id, PARTITIONS) if vector.composite else 0
    return shard, vector.positions[shard]


async def test_coalesce_ids_from_config_applies_at_start(
    layout: str, layout_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    config = layout_config(PARTITIONS, limits={**LIMITS, "coalesceIds": 10})
    async with start_publisher(config) as service:
        assert service.hub.lagging.coalesce_ids == 10, "the configured bound, not the default"
        slow = await RawListener.register(
            service.url, v1("vm", ["nic", "alias"], instance="coalescing", coalesce=True))
        committed = 0
        while _conn(service, "coalescing") is not None:
            assert committed < MAX_ITEMS, "never closed"
            committed += len(await _commit(service, committed, BATCH))
        assert service.hub.counters.coalesced["started"] == 1
        *_, close = await slow.read_to_end()
        assert close[0] == 0x8, close
        assert struct.unpack("!H", close[1][:2])[0] == 4008
        reason = close[1][2:].decode()
        assert reason == "slow consumer: more than 10 ids changed while it was behind"


async def _fall_behind(service: Service) -> list[tuple[str, list[str], str]]:
    """Commit until the coalescing listener is in a coalesced catch-up holding many ids."""
    committed: list[tuple[str, list[str], str]] = []
    hub = service.hub
    while (conn := _conn(service, "coalescing")) is None or conn.coalesced is None or (
        len(conn.coalesced) < 30 or conn.coalesced.folded < 3 * LIMITS["window"]
    ):
        assert conn is not None, "the coalescing listener was closed"
        assert len(committed) < MAX_ITEMS, "the coalescing listener never fell behind"
        committed += await _commit(service, len(committed), BATCH)
    # More than one when a catch-up ended in the socket buffers.
    assert hub.counters.coalesced["started"] >= 1
    return committed


async def test_a_coalescing_listener_killed_mid_catch_up_resumes_exactly(
    layout: str, layout_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    config = layout_config(PARTITIONS, limits={**LIMITS, "coalesceIds": 1000})
    async with start_publisher(config) as service:
        slow = await RawListener.register(
            service.url, v1("vm", ["nic", "alias"], instance="coalescing", coalesce=True))
        committed = await _fall_behind(service)

        # Read its exact items, then part of the coalesced ones; then the connection dies.
        reader = Reader(slow)
        before_kill: list[dict[str, Any]] = []
        coalesced = 0
        while coalesced < 10:  # ten items into the catch-up the listener is reading
            item = await reader.item()
            before_kill.append(item)
            coalesced = 0 if item.get("caughtUp") else coalesced + bool(item.get("coalesced"))
        last = before_kill[-1]["cursor"]
        slow.sock.close()

        # Changes go on meanwhile; the listener comes back with the last coalesced cursor.
        committed += await _commit(service, len(committed), 50)
        back = await register(service.ws_url, v1("vm", ["nic", "alias"], instance="coalescing",
                                                   since=last))
        assert back.reply["resumed"] is True
        vector = Position.decode(last)
        wanted = [(i, s, c) for i, s, c in committed if "state" not in s]
        after = [own(c, i) for i, _, c in wanted if own(c, i)[1] > vector.positions[own(c, i)[0]]]
        resumed = [await back.next() for _ in after]
        got = [own(i["cursor"], i["changedResourceId"]) for i in resumed]
        assert sorted(got) == sorted(after), "exactly the changes after the cursor"
        assert len(set(got)) == len(got), "none twice"
        assert not any(i.get("coalesced") for i in resumed)

        # Every change up to the cursor reached the listener before it died: as an exact item,
        # or merged into a later item of its id (sent before, or after the cursor).
        seen: dict[str, list[tuple[int, Any]]] = {}
        for item in [*before_kill, *resumed]:
            seen.setdefault(item["changedResourceId"], []).append(
                own(item["cursor"], item["changedResourceId"]))
        for changed_id, _, cursor in wanted:
            shard, position = own(cursor, changed_id)
            assert any(s == shard and at >= position for s, at in seen.get(changed_id, [])), (
                f"{changed_id} at {position} was never delivered")
        exact = [own(i["cursor"], i["changedResourceId"]) for i in before_kill
                 if not i.get("coalesced")]
        assert len(set(exact)) == len(exact), "no exact item twice"
        assert not set(exact) & set(got), "nothing before the kill comes again"
        await back.close()


async def test_the_coalesced_cursors_are_the_entries_own(
    layout: str, layout_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    """Each coalesced item's cursor is that of a change of its id, as any publisher issues it:
    on a bucket in a Redis Cluster a composite cursor stamped on the change, never a position
    that exists only inside the publisher."""
    config = layout_config(PARTITIONS, limits={**LIMITS, "coalesceIds": 1000})
    async with start_publisher(config) as service:
        slow = await RawListener.register(
            service.url, v1("vm", ["nic", "alias"], instance="coalescing", coalesce=True))
        committed = await _fall_behind(service)
        reader = Reader(slow)
        items: list[dict[str, Any]] = []
        while not (items and items[-1].get("caughtUp")):
            items.append(await reader.item())
        changes: dict[str, set[tuple[int, Any]]] = {}
        for changed_id, _, cursor in committed:
            changes.setdefault(changed_id, set()).add(own(cursor, changed_id))
        coalesced = [i for i in items if i.get("coalesced")]
        assert coalesced
        for item in coalesced:
            vector = Position.decode(item["cursor"])
            assert vector.epoch == service.hub.epoch
            assert vector.composite == (layout == "cluster")
            assert own(item["cursor"], item["changedResourceId"]) in (
                changes[item["changedResourceId"]]), "the cursor of a change of its id"
        # The caughtUp cursor resumes with nothing missing.
        after = await service.bucket.commit("vm", "after", ["nic"], {"n": 1})
        back = await register(service.ws_url, v1("vm", ["nic", "alias"], instance="back",
                                                   since=items[-1]["cursor"]))
        assert back.reply["resumed"] is True
        caught_up = Position.decode(items[-1]["cursor"])
        while (item := await back.next())["changedResourceId"] != "after":
            shard, position = own(item["cursor"], item["changedResourceId"])
            assert position > caught_up.positions[shard], "only what came after it"
        assert own(item["cursor"], "after") == own(after, "after")
        await back.close()
        slow.sock.close()
