"""`Listener(coalesce=True)` on a real publisher behind a real stalled network (the testing kit's
Proxy, blackholed): the publisher coalesces instead of closing it; the listener delivers one
coalesced Change per id, keeps its cursor where the exact items stopped until the last of them,
then goes on live, on the same connection (no Resync, no reconnect)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from changefeed_testing.proxy import Proxy
from listener import BootstrapDone, Change, Listener, ListenerConfig
from listener.events import Event
from publisher.bucket import Change as Put
from publisher.config.settings import Config
from tests.conftest import PublisherFactory
from tests.servers import RedisServer, scaled

LIMITS = {"window": 200, "sendBuffer": 16384, "pingInterval": 60, "coalesceIds": 1000}
IDS = 30
BATCH = 200
MAX_ITEMS = 60_000
LONG = "y" * 400


async def test_a_coalescing_listener_behind_a_stalled_network_catches_up_without_reconnecting(
    redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url, limits=LIMITS)
    async with start_publisher(config) as service:
        host, port = service.url.removeprefix("http://").split(":")
        async with Proxy(host, int(port)) as proxy:
            feed = Listener(proxy.url, instance="coalescing", service="tcns",
                            resources={"vm": ["nic"]}, coalesce=True,
                            config=ListenerConfig(ping_interval=None))
            events: list[Event] = []
            arrived = asyncio.Condition()

            async def consume() -> None:
                async for event in feed:
                    events.append(event)
                    async with arrived:
                        arrived.notify_all()

            async def until(check: Callable[[], bool], timeout: float = 15) -> None:
                async with asyncio.timeout(scaled(timeout)), arrived:
                    await arrived.wait_for(check)

            task = asyncio.create_task(consume())
            try:
                await until(lambda: any(isinstance(e, BootstrapDone) for e in events))
                hub = service.hub
                conn = next(iter(hub.connections))
                assert conn.registration.coalesce
                proxy.blackhole()
                committed: list[tuple[str, str]] = []
                coalesced = hub.counters.coalesced
                while coalesced["started"] == 0 or len(committed) < 6 * LIMITS["window"]:
                    assert len(committed) < MAX_ITEMS, "never fell out of the window"
                    assert conn in hub.connections, "closed instead of coalesced"
                    ids = [f"{LONG}-{(len(committed) + i) % IDS}" for i in range(BATCH)]
                    cursors = await service.bucket.commit_many(
                        Put.put("vm", id_, ["nic"], {"uuid": id_}) for id_ in ids)
                    committed += zip(ids, cursors, strict=True)
                proxy.pass_through()
                last = committed[-1][1]
                await until(lambda: isinstance(events[-1], Change) and events[-1].cursor == last)
                changes = [e for e in events if isinstance(e, Change)]
                runs = _account(changes, committed)
                assert runs >= 1 and runs == hub.counters.coalesced["finished"]
                assert feed.cursor == last

                after = await service.bucket.commit("vm", "after", ["nic"], {"uuid": "after"})
                await until(lambda: isinstance(events[-1], Change) and events[-1].cursor == after)
                assert not events[-1].coalesced  # type: ignore[union-attr]
                assert feed.cursor == after
                assert sum(isinstance(e, BootstrapDone) for e in events) == 1, "no reconnect"
                assert conn in hub.connections
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await feed.aclose()


def _account(changes: list[Change], committed: list[tuple[str, str]]) -> int:
    """Check that `changes` account for every committed (id, cursor) exactly once: exact items
    in order, or runs of coalesced items, each run standing for the committed items since the
    last exact one up to its caughtUp item: one item per id, the newest cursor, cursors growing.
    Returns the number of coalesced runs."""
    index = {cursor: n for n, (_, cursor) in enumerate(committed)}
    at = runs = 0
    run: list[Change] = []
    for change in changes:
        if not change.coalesced:
            assert not run, "an exact item inside a coalesced run"
            assert change.cursor == committed[at][1], f"exact item {at} out of order"
            at += 1
            continue
        run.append(change)
        if change.caught_up:
            end = index[change.cursor]
            newest = dict(committed[at : end + 1])
            assert {c.id: c.cursor for c in run} == newest and len(run) == len(newest)
            assert [index[c.cursor] for c in run] == sorted(index[c.cursor] for c in run)
            at, run, runs = end + 1, [], runs + 1
    assert not run and at == len(committed), "everything committed, accounted for"
    return runs
