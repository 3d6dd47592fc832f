"""Pulling from both layouts (one Redis, the 3-master Redis Cluster): `events` oldest first with
the pull consumer, what needs an `ordered` bucket, the feed's per-partition cursors; the Python
Listener's bootstrap, changes and read-your-writes; `min_cursor`."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import orjson

from changefeed.cursor import Position, StreamId
from listener import BootstrapRecords, Change, ChangeItem, Listener, PullConsumer
from publisher.bucket import partition_of
from publisher.config.settings import Config
from tests.conftest import PublisherFactory
from tests.listener.test_client import FAST
from tests.listener.test_read_your_writes import iterating
from tests.publisher.layouts import PARTITIONS, by_commit_order, commit
from tests.servers import scaled


async def test_the_pull_consumer_follows_the_bucket(
    layout: str, layout_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    async with start_publisher(layout_config(PARTITIONS)) as service:
        committed = await commit(service, "e", 30)
        async with PullConsumer(service.url, resource="vm") as consumer:
            first = await consumer.fetch(12, expires=5)
            assert len(first) == 12
            saved = consumer.cursor
            assert saved is not None and Position.decode(saved).epoch == service.hub.epoch
        rest: list[ChangeItem] = []
        async with PullConsumer(service.url, resource="vm", after=saved) as resumed:
            while len(rest) < 18:
                rest += await resumed.fetch(100, expires=5)
        got = [i.changed_resource_id for i in [*first, *rest]]
        assert sorted(got) == sorted(committed), "each item once, none missing"
        assert by_commit_order(got)

        async with aiohttp.ClientSession() as http:
            url = service.url + "/changefeeds/events"
            async with http.get(url, params={"order": "oldest", "before": saved}) as r:
                body = await r.json()
            if layout == "cluster":
                assert r.status == 400 and "`ordered`" in body["message"], body
                assert "oldest first" in body["message"]
            else:
                assert r.status == 200 and len(body["items"]) == 11, body  # before: exclusive
            await service.bucket.log.trim(None, PARTITIONS)
            params = {"order": "oldest", "after": saved, "wait_time": "1ms"}
            async with http.get(url, params=params) as r:
                reply = await r.json()
            assert r.status == 200 and reply["missed"] is True


async def test_the_feed_gives_each_partition_its_own_cursor(
    layout_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    async with start_publisher(layout_config(PARTITIONS)) as service:
        committed = await commit(service, "f", 20)
        params = {"n": str(PARTITIONS), **{f"cursor{p}": "_first" for p in range(PARTITIONS)}}
        seen: list[str] = []
        checkpoints: dict[int, str] = {}
        async with aiohttp.ClientSession() as http:
            for _ in range(10):
                moved = {f"cursor{p}": c for p, c in checkpoints.items()}
                query = {**params, "pagesizehint": "7", **moved}
                async with http.get(service.url + "/changefeeds/feed/v1", params=query) as r:
                    assert r.status == 200, await r.text()
                    body = await r.read()
                for line in body.splitlines():
                    record = orjson.loads(line)
                    if "cursor" in record:
                        checkpoints[record["partition"]] = record["cursor"]
                    else:
                        id = record["data"]["changedResourceId"]
                        assert record["partition"] == partition_of(id, PARTITIONS)
                        seen.append(id)
                if len(seen) >= 20:
                    break
            assert sorted(seen) == sorted(committed), "each once"
            for text in checkpoints.values():
                assert Position.decode(text).epoch == service.hub.epoch
            query = {**params, **{f"cursor{p}": checkpoints[p] for p in range(PARTITIONS)}}
            async with http.get(service.url + "/changefeeds/feed/v1", params=query) as r:
                assert r.status == 200 and not [
                    line for line in (await r.read()).splitlines() if b"changedResourceId" in line
                ]


async def test_a_listener_bootstraps_follows_and_waits_for_its_writes(
    layout_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    async with start_publisher(layout_config(PARTITIONS)) as service:
        stored = await commit(service, "b", 12)
        feed = Listener(service.url, instance="i-1", service="tcns", resources={"vm": ["nic"]},
                        config=FAST)
        async with iterating(feed) as got:
            await feed.wait_for(stored["b-11"], scaled(10))  # covered by the bootstrap
            records = [r for e in got if isinstance(e, BootstrapRecords) for r in e.objects]
            assert sorted(r["uuid"] for r in records) == sorted(stored)
            written = await commit(service, "c", 5)
            for cursor in written.values():
                await feed.wait_for(cursor, scaled(10))
            changes = [e for e in got if isinstance(e, Change)]
            assert {c.item.changed_resource_id for c in changes} >= set(written)
            assert feed.cursor is not None
            assert all(Position.decode(feed.cursor).covers(Position.decode(c))
                       for c in written.values())


async def test_bootstrap_waits_for_a_min_cursor(
    layout_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    async with start_publisher(layout_config(PARTITIONS)) as service:
        written = await commit(service, "m", 3)
        url = service.url + "/vms"
        async with aiohttp.ClientSession() as http:
            for cursor in written.values():
                async with http.get(url, params={"min_cursor": cursor}) as r:
                    assert r.status == 200
            mine = Position.decode(written["m-0"])
            ahead = mine.with_positions([StreamId(at.ms + 10**9, 0) for at in mine.positions])
            async with http.get(url, params={"min_cursor": ahead.encode(), "wait": "0.1"}) as r:
                assert r.status == 504
            foreign = type(mine)("abcdefghij", mine.positions, mine.composite).encode()
            async with http.get(url, params={"min_cursor": foreign}) as r:
                assert r.status == 410  # CursorGone, as on the pull routes
            async with http.get(url, params={"min_cursor": "not-a-cursor"}) as r:
                assert r.status == 400
