"""Publishers on both layouts (one Redis, the 3-master Redis Cluster): websocket fan-out, resume
(on the same and on another publisher, from Redis past the window, outrun by the window), bootstrap
pages merged over the shards, server-sent events, what a trim and a lost shard do."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from changefeed.cursor import ZERO, Position, StreamId, new_epoch
from publisher.bucket import Change, ChangeBucket
from publisher.config.settings import Config, load_config
from publisher.delivery.hub import TRIMMED
from tests.conftest import PublisherFactory
from tests.listener.app import bucket_of, publisher_process
from tests.publisher.delivery.test_tail import _get_json, _until_closed, stopped
from tests.publisher.layouts import PARTITIONS, by_commit_order, check_order, commit, own
from tests.publisher.web.test_sse import stream
from tests.servers import write_config
from tests.wsclient import refused, register, v1


async def test_fan_out_and_resume(
    layout: str, layout_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    config = layout_config(PARTITIONS, limits={"window": 20})
    async with start_publisher(config) as a, start_publisher(config) as b:
        first = await register(a.ws_url, v1("vm", ["nic"]))
        start = Position.decode(first.reply["cursor"])
        assert start.composite == (layout == "cluster")
        assert start.positions == (ZERO,) * len(start.positions)
        committed = await commit(a, "a", 30)
        items = await first.take(30)
        assert {i["changedResourceId"] for i in items} == set(committed)
        check_order(items)
        # Each commit's cursor is covered by the item that carried it.
        for item in items:
            mine = Position.decode(committed[item["changedResourceId"]])
            assert Position.decode(item["cursor"]).covers(mine)
        await first.close()

        # 200 missed (more than the window of 20: read from Redis) plus some of another
        # sub-resource the listener does not want, and more arriving while it replays.
        missed = await commit(a, "b", 200)
        await commit(a, "skip", 10, ("state",))
        later = asyncio.create_task(commit(a, "c", 40))
        since = items[-1]["cursor"]
        resumed = await register(b.ws_url, v1("vm", ["nic"], since=since))
        assert resumed.reply["resumed"] is True and resumed.reply["cursor"] == since
        got = await resumed.take(240)
        ids = [i["changedResourceId"] for i in got]
        assert sorted(ids) == sorted([*missed, *await later]), "no gap, no duplicate"
        check_order(got)
        assert by_commit_order(ids), "order within each partition is commit order"
        assert await resumed.quiet()

        # Resuming at the head exactly: nothing replayed, then live items.
        head = await register(a.ws_url, v1("vm", ["*"], since=got[-1]["cursor"]))
        assert head.reply["resumed"] is True
        tail = await commit(a, "d", 3)
        assert {i["changedResourceId"] for i in await head.take(3)} == set(tail)

        async with aiohttp.ClientSession() as http:
            async with http.get(a.url + "/changefeeds/stats") as r:
                stats = await r.json()
            assert r.status == 200
            read_to = Position.decode(stats["tail"]["position"])
            assert read_to.covers(Position.decode(got[-1]["cursor"]))
            sent = [s["lastCursorSent"] for s in stats["registrations"]]
            assert sent and all(c is None or Position.decode(c).epoch == a.hub.epoch for c in sent)


async def test_a_cursor_of_the_other_kind_is_not_resumed(
    layout: str, layout_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    """A cluster bucket starts over from a single-position cursor or a composite one of another
    partition count; an ordered bucket refuses a composite cursor (1008) and starts over from
    one of another epoch."""
    async with start_publisher(layout_config(PARTITIONS)) as service:
        single = Position.single(new_epoch(), StreamId(1, 0)).encode()
        fresh = await register(service.ws_url, v1("vm", ["nic"], since=single))
        assert fresh.reply["resumed"] is False
        composite = Position(service.hub.epoch, (ZERO,)).encode()
        body = orjson.dumps(v1("vm", ["nic"], since=composite)).decode()
        if layout == "cluster":
            fresh = await register(service.ws_url, v1("vm", ["nic"], since=composite))
            assert fresh.reply["resumed"] is False
        else:
            code, reason = await refused(service.ws_url, body)
            assert code == 1008 and "composite" in reason


async def test_bootstrap_pages_merge_the_shards_by_id(
    layout_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    async with start_publisher(layout_config(PARTITIONS)) as service:
        committed = await commit(service, "p", 25)
        seen: list[str] = []
        url = f"{service.url}/vms?limit=7"
        async with aiohttp.ClientSession() as http:
            while url:
                async with http.get(url) as response:
                    page = await response.json()
                seen += [item["uuid"] for item in page["items"]]
                cursor = Position.decode(page["cursor"])
                url = f"{service.url}{page['next']}" if page["next"] else ""
        assert seen == sorted(committed, key=lambda id: id.encode())
        for text in committed.values():
            assert cursor.covers(Position.decode(text))


async def test_a_trimmed_cursor_is_not_resumed_and_a_lost_shard_is_a_new_epoch(
    layout_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    async with start_publisher(layout_config(PARTITIONS)) as service:
        listener = await register(service.ws_url, v1("vm", ["nic"]))
        await commit(service, "t", 12)
        items = await listener.take(12)
        old = items[0]["cursor"]
        removed = await service.bucket.log.trim(None, 4)  # 4 items kept in all
        assert removed >= 8
        stale = await register(service.ws_url, v1("vm", ["nic"], since=old))
        assert stale.reply["resumed"] is False
        kept = await register(service.ws_url, v1("vm", ["nic"], since=items[-1]["cursor"]))
        assert kept.reply["resumed"] is True

        # One shard's keys are lost (its Redis came back empty): a new bucket epoch and every
        # listener told to bootstrap again.
        epoch = service.hub.epoch
        shard, _ = own(items[0]["cursor"], items[0]["changedResourceId"])
        lost = (await service.bucket.log.shards())[shard]
        await lost.redis.delete(*await lost.streams(), lost.keys.epoch, lost.keys.last,
                                lost.keys.trimmed)
        await asyncio.wait_for(listener.ws.wait_closed(), 15)
        assert listener.ws.close_code == 4009
        assert service.hub.epoch != epoch
        again = await register(service.ws_url, v1("vm", ["nic"], since=items[-1]["cursor"]))
        assert again.reply["resumed"] is False
        assert Position.decode(again.reply["cursor"]).epoch == service.hub.epoch


async def test_server_sent_events_carry_and_resume_cursors(
    layout_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    async with start_publisher(layout_config(PARTITIONS)) as service:
        async with stream(service.url, "resource=vm&sub=nic") as feed:
            registered = await feed.next()
            assert registered.id is not None
            assert Position.decode(registered.id).epoch == service.hub.epoch
            first = await commit(service, "s", 6)
            items = await feed.changes(6)
            assert {i["changedResourceId"] for i in items} == set(first)
            check_order(items)
        later = await commit(service, "t", 5)
        resume = {"Last-Event-ID": items[-1]["cursor"]}
        async with stream(service.url, "resource=vm&sub=nic", **resume) as feed:
            assert orjson.loads((await feed.next()).data)["resumed"] is True
            again = await feed.changes(5)
            assert {i["changedResourceId"] for i in again} == set(later)


async def test_a_resume_outrun_by_the_window_replays_again_and_loses_nothing(
    layout_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    async with start_publisher(layout_config(PARTITIONS, limits={"window": 3})) as service:
        first = await register(service.ws_url, v1("vm", ["nic"]))
        await commit(service, "x", 1)
        since = (await first.take(1))[0]["cursor"]
        await first.close()
        missed = await commit(service, "y", 300)

        async def trickle() -> list[str]:
            ids = []
            for n in range(60):  # one at a time: the window of 3 moves on during the replay
                ids += list(await commit(service, f"z{n}", 1))
            return ids

        later = asyncio.create_task(trickle())
        resumed = await register(service.ws_url, v1("vm", ["nic"], since=since))
        assert resumed.reply["resumed"] is True
        got = [i["changedResourceId"] for i in await resumed.take(360, timeout=30)]
        assert sorted(got) == sorted([*missed, *await later])
        assert await resumed.quiet()


async def test_a_stalled_tail_under_another_writers_trim_closes_its_listeners(
    layout: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The publisher is stopped while another writer commits and trims: its tail meets a trim
    gap in a shard, closes the listener with 4009 after a gap-free prefix, counts the gap, and
    goes on (a listener registered after it gets new changes)."""
    bucket_section: dict[str, Any] = {"name": "stall", "partitions": PARTITIONS}
    url = None
    if layout == "redis":
        url = request.getfixturevalue("redis_server").url
        bucket_section["redisUrl"] = url
    else:
        bucket_section["cluster"] = request.getfixturevalue("redis_cluster").node_urls
    path = write_config(tmp_path / "config.js", url, bucket=bucket_section,
                        limits={"pingInterval": 60})
    async with bucket_of(load_config(path)) as bucket, publisher_process(path) as b:
        live = await register(b.ws_url, v1("vm", ["nic"], instance="live"))
        closing = asyncio.create_task(_until_closed(live))
        with stopped(b):
            burst = await bucket.commit_many(
                Change.put("vm", f"b-{i:04}", ["nic"], {"n": i}) for i in range(2000))
            assert await bucket.log.trim(None, 100) >= 1800
        items, code, reason = await closing
        assert (code, reason) == (4009, TRIMMED)
        sent = {own(i["cursor"], i["changedResourceId"]) for i in items}
        assert sent <= {own(c, f"b-{i:04}") for i, c in enumerate(burst)}
        stats = await _get_json(b.url + "/changefeeds/stats")
        assert stats["tail"]["trimGaps"] >= 1 and stats["tail"]["healthy"] is True
        after = await register(b.ws_url, v1("vm", ["nic"], instance="after"))
        cursors = await commit_in(bucket, "c", 3)
        got = await after.take(3)
        assert {i["changedResourceId"] for i in got} == set(cursors)
        await after.close()


async def commit_in(bucket: ChangeBucket, prefix: str, n: int) -> dict[str, str]:
    ids = [f"{prefix}-{i}" for i in range(n)]
    cursors = await bucket.commit_many(Change.put("vm", i, ["nic"], {"n": 1}) for i in ids)
    return dict(zip(ids, cursors, strict=True))
