"""Registrations with `since`: resumed inside the retained log, not outside it or across epochs;
none while Redis holds an epoch the tail has not read."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import orjson
import pytest

from changefeed.cursor import Position, StreamId
from publisher.bucket import Change
from publisher.bucket.log.shard import Shard
from publisher.config.settings import Config
from publisher.server.service import Service
from publisher.web.http import EPOCH_NOT_READ
from tests.conftest import PublisherFactory
from tests.failpoint import HoldOnce
from tests.servers import RedisServer, eventually, scaled
from tests.wsclient import refused, register, v1, v2


async def _commit(
    service: Service, n: int, prefix: str, subs: list[str] | None = None
) -> list[str]:
    return await service.bucket.commit_many(
        Change.put("vm", f"{prefix}-{i}", subs or ["nic"], {"uuid": f"{prefix}-{i}"})
        for i in range(n)
    )


async def test_resume_from_the_window_and_from_redis_has_no_gap_and_no_duplicate(
    redis_server: RedisServer, make_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    # A window of 20 items: resuming 200 items back must read from Redis, then join the window.
    config = make_config(redis_server.url, limits={"window": 20})
    async with start_publisher(config) as service:
        first = await register(service.ws_url, v1("vm", ["nic"]))
        seen = await _commit(service, 5, "a")
        assert [i["cursor"] for i in await first.take(5)] == seen
        await first.close()

        missed = await _commit(service, 200, "b") + await _commit(service, 30, "skip", ["state"])
        nic_missed = missed[:200]
        # Items keep arriving while the listener replays.
        later = asyncio.create_task(_commit(service, 50, "c"))
        resumed = await register(service.ws_url, v1("vm", ["nic"], since=seen[-1]))
        assert resumed.reply["resumed"] is True
        got = [i["cursor"] for i in await resumed.take(250)]
        assert got == nic_missed + await later
        assert await resumed.quiet()

        # From the head exactly: nothing to replay, then live items.
        head = await register(service.ws_url, v1("vm", ["*"], since=got[-1]))
        assert head.reply["resumed"] is True
        tail = await _commit(service, 3, "d")
        assert [i["cursor"] for i in await head.take(3)] == tail


async def test_since_outside_the_retained_log_is_not_resumed(publisher: Service) -> None:
    old = await _commit(publisher, 3, "old")
    await asyncio.sleep(0.2)
    await publisher.bucket.log.trim(0.1)
    fresh = await register(publisher.ws_url, v1("vm", ["nic"], since=old[0]))
    assert fresh.reply["resumed"] is False
    new = await _commit(publisher, 1, "new")
    assert [i["cursor"] for i in await fresh.take(1)] == new, (
        "a non-resumed listener gets live items"
    )

    # The newest trimmed item is the horizon: resuming from it loses nothing.
    edge = await register(publisher.ws_url, v1("vm", ["nic"], since=old[-1]))
    assert edge.reply["resumed"] is True
    assert [i["cursor"] for i in await edge.take(1)] == new

    future = Position.single(publisher.hub.epoch, StreamId(2**46, 0))
    ahead = await register(publisher.ws_url, v1("vm", ["nic"], since=future.encode()))
    assert ahead.reply["resumed"] is False, "a cursor beyond the log head is not of this log"


async def test_recreated_bucket_is_a_new_epoch(publisher: Service) -> None:
    cursors = await _commit(publisher, 2, "e")
    feed = await register(publisher.ws_url, v2({"vm": ["nic"]}), "~2")
    old_epoch = publisher.hub.epoch
    await publisher.bucket.redis.flushall()  # the bucket is lost
    await asyncio.wait_for(feed.ws.wait_closed(), scaled(10))
    assert feed.ws.close_code == 4009
    assert publisher.hub.epoch != old_epoch

    again = await register(publisher.ws_url, v1("vm", ["nic"], since=cursors[-1]))
    assert again.reply["resumed"] is False, "a cursor of the old epoch is foreign"
    assert not again.reply["cursor"].startswith(old_epoch)
    new = await _commit(publisher, 2, "f")
    items = await again.take(2)
    assert [i["cursor"] for i in items] == new
    assert all(Position.decode(c).epoch == publisher.hub.epoch for c in new)


async def test_no_registration_while_redis_holds_an_epoch_the_tail_has_not_read(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis lost its history and began a new epoch, and this publisher's tail has not read it
    yet (its read is late: a partition, in the nemesis). A registration is refused (1013; SSE:
    503) until the tail has read it, then starts in the new epoch. Before, it was registered at
    the tail's head in the old epoch: sent that history's late entries after a bootstrap of the
    new one, from a head behind the cursor the listener had (the 30-minute soak, seed 12: a
    listener got a change it already had)."""
    async with start_publisher(make_config(redis_server.url)) as service:
        seen = await _commit(service, 2, "a")
        old = service.hub.epoch
        late = HoldOnce(monkeypatch, Shard, "tail")
        try:
            await _commit(service, 1, "b")  # ends the tail's blocking read: the next is held
            await asyncio.wait_for(late.reached.wait(), scaled(10))
            await service.bucket.redis.flushall()  # Redis came back empty
            new = await _commit(service, 1, "c")
            epoch = Position.decode(new[0]).epoch
            assert epoch != old and service.hub.epoch == old, "a new epoch the tail has not read"

            for frame in (v1("vm", ["nic"], since=seen[-1]), v1("vm", ["nic"])):
                assert await refused(service.ws_url, orjson.dumps(frame).decode()) == (
                    1013, EPOCH_NOT_READ)
            async with aiohttp.ClientSession() as http, http.get(
                f"{service.url}/changefeeds/sse?resource=vm&sub=nic&service=tcns"
            ) as response:
                assert response.status == 503
                assert (await response.json())["code"] == "EpochNotRead"
                assert response.headers["Retry-After"] == "1"
        finally:
            late.release()
        await eventually(lambda: service.hub.epoch == epoch, "the tail read the new epoch")
        again = await register(service.ws_url, v1("vm", ["nic"], since=seen[-1]))
        assert again.reply["resumed"] is False
        assert Position.decode(again.reply["cursor"]).epoch == epoch
        after = await _commit(service, 1, "d")
        assert [i["cursor"] for i in await again.take(1)] == after
