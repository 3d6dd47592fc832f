"""Read-your-writes (issue 17, item 1): Listener.wait_for and the bootstrap routes' min_cursor,
against a real publisher on a real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest

from changefeed.cursor import Position
from changefeed.errors import CursorGone
from listener import BootstrapDone, Change, Event, Listener
from publisher.server.service import Service
from tests.listener.test_client import FAST
from tests.servers import scaled


@contextlib.asynccontextmanager
async def iterating(feed: Listener) -> AsyncIterator[list[Event]]:
    """Iterate `feed` in a task of its own (as an application does); yields what it delivered."""
    got: list[Event] = []

    async def consume() -> None:
        async for event in feed:
            got.append(event)

    task = asyncio.create_task(consume())
    try:
        yield got
    finally:
        await feed.aclose()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_wait_for_resolves_once_the_change_was_handed_over(publisher: Service) -> None:
    bucket = publisher.bucket
    before = await bucket.commit("vm", "vm-0", ["nic"], {"n": 0})
    feed = Listener(publisher.url, instance="i-1", service="tcns", resources={"vm": ["nic"]},
                    config=FAST)
    async with iterating(feed) as got:
        # A bootstrap that began after the commit covers it.
        await feed.wait_for(before, scaled(5))
        assert any(isinstance(e, BootstrapDone) and e.cursor for e in got)
        cursor = await bucket.commit("vm", "vm-1", ["nic"], {"n": 1})
        await feed.wait_for(cursor, scaled(5))
        assert isinstance(got[-1], Change) and got[-1].cursor == cursor
        # A change this listener does not hear about is covered by a later one it does.
        other = await bucket.commit("vm", "vm-2", ["alias"], {"n": 2})
        waiting = asyncio.create_task(feed.wait_for(other, scaled(5)))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        later = await bucket.commit("vm", "vm-3", ["nic"], {"n": 3})
        await waiting
        assert feed.cursor == later
        with pytest.raises(TimeoutError):
            await feed.wait_for(await bucket.commit("vm", "vm-4", ["alias"], {}), 0.2)
        foreign = Position.single("abcdefghij", Position.decode(later).position).encode()
        with pytest.raises(CursorGone):
            await feed.wait_for(foreign, scaled(5))


async def test_bootstrap_routes_wait_for_min_cursor(publisher: Service) -> None:
    bucket = publisher.bucket
    cursor = await bucket.commit("vm", "vm-1", ["nic"], {"uuid": "vm-1"})
    head = Position.decode(cursor)
    ahead = Position.single(head.epoch, type(head.position)(head.position.ms + 2000, 0)).encode()
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{publisher.url}/vms?min_cursor={cursor}") as response:
            assert response.status == 200
            assert (await response.json())["items"] == [{"uuid": "vm-1"}]
        async with http.get(f"{publisher.url}/vms/vm-1?min_cursor={cursor}") as response:
            assert response.status == 200
        async with http.get(f"{publisher.url}/vms?min_cursor={ahead}&wait=0.2") as response:
            assert response.status == 504
            assert (await response.json())["code"] == "MinCursorTimeout"
        foreign = Position.single("abcdefghij", head.position).encode()
        async with http.get(f"{publisher.url}/vms?min_cursor={foreign}") as response:
            assert response.status == 410  # CursorGone, as on the pull routes
            assert (await response.json())["code"] == "CursorGone"
        async with http.get(f"{publisher.url}/vms?min_cursor=zz") as response:
            assert response.status == 400

        # A cursor just ahead of the head: the answer waits for the commit that reaches it.
        async def page() -> tuple[int, object]:
            async with http.get(f"{publisher.url}/vms?min_cursor={ahead}&wait=10") as response:
                return response.status, await response.json()

        waiting = asyncio.create_task(page())
        await asyncio.sleep(0.2)
        assert not waiting.done()
        while Position.decode(cursor).position < Position.decode(ahead).position:
            cursor = await bucket.commit("vm", "vm-2", ["nic"], {"uuid": "vm-2"})
            await asyncio.sleep(0.1)
        status, body = await asyncio.wait_for(waiting, scaled(5))
        assert status == 200 and {"uuid": "vm-2"} in body["items"]  # type: ignore[index]
