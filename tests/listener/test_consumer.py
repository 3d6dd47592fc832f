"""The pull consumer against real publishers on a real redis-server: fetch, next, consume,
thresholds, drain, stop, restarts, trimmed cursors and missed heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from listener import (
    Backoff,
    ChangeItem,
    ConsumeState,
    HeartbeatMissed,
    InvalidOption,
    ItemsMissed,
    PullConsumer,
    PullFailed,
    PullRejected,
)
from listener.consumer_state import item_size
from publisher.bucket import ChangeBucket
from publisher.config.settings import Config, load_config
from publisher.server.service import Service
from tests.listener.app import bucket_of, publisher_process, vm
from tests.records import logged
from tests.servers import RedisServer, eventually, free_port, scaled, write_config

FAST = Backoff(initial=0.02, maximum=0.2)


async def commit(bucket: ChangeBucket, prefix: str, count: int, subs: tuple[str, ...] = ("nic",)
                 ) -> list[str]:
    return [await bucket.commit("vm", f"{prefix}-{n:03}", list(subs), vm(f"{prefix}-{n:03}"))
            for n in range(count)]


def cursors(items: list[ChangeItem]) -> list[str]:
    return [item.cursor for item in items]


async def collect(source: AsyncIterator[ChangeItem], into: list[ChangeItem],
                  until: Callable[[], bool]) -> None:
    async with asyncio.timeout(scaled(20)):
        async for item in source:
            into.append(item)
            if until():
                return


# --- fetch and next ---------------------------------------------------------------------------


async def test_fetch_returns_up_to_max_messages_oldest_first(publisher: Service) -> None:
    committed = await commit(publisher.bucket, "a", 25)
    async with PullConsumer(publisher.url, resource="vm", backoff=FAST) as consumer:
        first = await consumer.fetch(10, expires=5)
        assert cursors(first) == committed[:10] and consumer.cursor == committed[9]
        assert first[0].changed_resource_id == "a-000" and first[0].sub_resources == ("nic",)
        second = await consumer.fetch(10, expires=5)
        third = await consumer.fetch(10, expires=5)
        assert cursors(second + third) == committed[10:]
    async with PullConsumer(publisher.url, after=committed[19]) as resumed:
        assert cursors(await resumed.fetch(100, expires=5)) == committed[20:]


async def test_fetch_waits_up_to_expires_and_returns_early_when_an_item_arrives(
    publisher: Service,
) -> None:
    async with PullConsumer(publisher.url, backoff=FAST) as consumer:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await consumer.fetch(10, expires=1, idle_heartbeat=0.5) == []
        assert loop.time() - started >= 0.99
        assert consumer.cursor is None

        with logged() as logs:
            fetching = asyncio.create_task(consumer.fetch(10, expires=60))
            await eventually(lambda: any(log["event"] == "pull" for log in logs), "a pull is sent")
            cursor = await publisher.bucket.commit("vm", "late", ["nic"], vm("late"))
            async with asyncio.timeout(scaled(10)):  # well before the 30 s long poll ends
                items = await fetching
        assert cursors(items) == [cursor]


async def test_next_returns_one_item_or_none(publisher: Service) -> None:
    committed = await commit(publisher.bucket, "a", 2)
    async with PullConsumer(publisher.url, resource="vm", sub_resources=["nic"]) as consumer:
        one = await consumer.next(expires=5)
        two = await consumer.next(expires=5)
        assert [one and one.cursor, two and two.cursor] == committed
        assert await consumer.next(expires=1, idle_heartbeat=0.5) is None
        assert consumer.cursor == committed[1]


async def test_fetch_by_bytes_returns_what_fits_and_loses_nothing(publisher: Service) -> None:
    committed = await commit(publisher.bucket, "a", 10)
    async with PullConsumer(publisher.url) as consumer:
        first = await consumer.fetch(10, expires=5)
        size = item_size(first[0])
    async with PullConsumer(publisher.url) as consumer:
        items = await consumer.fetch(max_bytes=3 * size + size // 2, expires=5)
        assert cursors(items) == committed[:3]
        rest = await consumer.fetch(max_bytes=100 * size, expires=5)
        assert cursors(rest) == committed[3:]


async def test_the_selection_narrows_what_is_pulled(publisher: Service) -> None:
    bucket = publisher.bucket
    wanted = [
        await bucket.commit("vm", "srv/1", ["alias"], vm("srv/1")),
        await bucket.commit("vm", "one", ["nic", "alias"], vm("one")),
    ]
    await bucket.commit("vm", "srv/2", ["nic"], vm("srv/2"))  # not the sub-resource
    await bucket.commit("vm", "other", ["alias"], vm("other"))  # neither id nor prefix
    await bucket.commit("network", "srv/3", ["name"], {"uuid": "srv/3"})  # not the resource
    async with PullConsumer(publisher.url, resource="vm", sub_resources=["alias"],
                            ids=["one"], prefixes=["srv"]) as consumer:
        assert cursors(await consumer.fetch(100, expires=1, idle_heartbeat=0.5)) == wanted


async def test_bad_parameters_are_raised_not_retried(publisher: Service) -> None:
    errors: list[BaseException] = []
    async with PullConsumer(publisher.url, resource="nosuch", on_error=errors.append) as consumer:
        with pytest.raises(PullRejected) as caught:
            await consumer.fetch(10, expires=5)
    assert caught.value.status == 400 and "nosuch" in caught.value.message
    assert errors == []
    async with PullConsumer(publisher.url, after="not-a-cursor") as consumer:
        with pytest.raises(PullRejected) as caught:
            await consumer.fetch(10, expires=5)
    assert caught.value.status == 400 and "after" in caught.value.message
    with pytest.raises(InvalidOption):
        PullConsumer(publisher.url, sub_resources=["nic"])
    with pytest.raises(InvalidOption):
        PullConsumer("vmapi:8080")
    async with PullConsumer(publisher.url) as consumer:
        with pytest.raises(InvalidOption) as option:
            await consumer.fetch(10, max_bytes=10)
        assert option.value.option == "max_bytes"
        with pytest.raises(InvalidOption):
            consumer.consume(max_messages=10, threshold_messages=11)


# --- consume ----------------------------------------------------------------------------------


async def test_consume_refills_at_the_threshold_asking_for_what_fits(publisher: Service) -> None:
    committed = await commit(publisher.bucket, "a", 100)
    items: list[ChangeItem] = []
    most_buffered = 0
    with logged() as logs:
        async with PullConsumer(publisher.url, resource="vm") as consumer:
            async with consumer.consume(max_messages=20, threshold_messages=5,
                                        expires=2) as consumption:
                async with asyncio.timeout(scaled(20)):
                    async for item in consumption:
                        items.append(item)
                        most_buffered = max(most_buffered, consumption.buffered)
                        await asyncio.sleep(0)  # an application that awaits between items
                        if len(items) == len(committed):
                            break
            assert consumer.cursor == committed[-1]
    assert cursors(items) == committed
    asked = [log["max_results"] for log in logs if log["event"] == "pull"]
    # The first pull fills the buffer; each refill is sent at the threshold (5 left) and asks
    # for the 15 that fit, never more than the buffer holds.
    assert asked[0] == 20 and set(asked[1:6]) == {15}
    assert all(n <= 20 for n in asked) and most_buffered <= 20
    assert len(asked) <= 1 + 100 // 15 + 3  # refills, not a pull per item


async def test_max_messages_one_does_not_stall(publisher: Service) -> None:
    committed = await commit(publisher.bucket, "a", 50)
    items: list[ChangeItem] = []
    async with PullConsumer(publisher.url) as consumer:
        consumption = consumer.consume(max_messages=1, expires=2)
        await collect(consumption, items, lambda: len(items) == 25)
        committed += await commit(publisher.bucket, "b", 5)  # and live ones meanwhile
        await collect(consumption, items, lambda: len(items) == 55)
        assert consumption.buffered <= 1
        consumption.stop()
    assert cursors(items) == committed


async def test_consume_by_bytes_never_buffers_more_than_max_bytes(publisher: Service) -> None:
    committed = await commit(publisher.bucket, "a", 40)
    most = 0
    async with PullConsumer(publisher.url) as consumer:
        items = await consumer.fetch(1, expires=5)  # all items are the same size
        size = item_size(items[0])
        consumption = consumer.consume(max_bytes=5 * size + size // 2, expires=2)
        async with asyncio.timeout(scaled(20)):
            async for item in consumption:
                items.append(item)
                most = max(most, consumption.buffered_bytes)
                await asyncio.sleep(0)
                if len(items) == len(committed):
                    break
        consumption.stop()
    assert cursors(items) == committed and most <= 5 * size


async def test_drain_delivers_the_buffered_items_then_ends(publisher: Service) -> None:
    committed = await commit(publisher.bucket, "a", 30)
    async with PullConsumer(publisher.url) as consumer:
        consumption = consumer.consume(max_messages=10, expires=2)  # refills at 5
        items = [await anext(consumption) for _ in range(3)]
        assert consumption.buffered == 7
        consumption.drain()
        assert consumption.state is ConsumeState.DRAINING
        async with asyncio.timeout(scaled(10)):
            items += [item async for item in consumption]
        assert (consumption.state, consumption.pulls) == (ConsumeState.DONE, 1)  # no refill
        assert cursors(items) == committed[:10] and consumer.cursor == committed[9]
        assert cursors(await consumer.fetch(100, expires=5)) == committed[10:]


async def test_stop_drops_the_buffer_and_the_cursor_stays_at_the_last_delivered(
    publisher: Service,
) -> None:
    committed = await commit(publisher.bucket, "a", 30)
    async with PullConsumer(publisher.url) as consumer:
        items: list[ChangeItem] = []
        consumption = consumer.consume(max_messages=10, expires=2)
        async for item in consumption:
            items.append(item)
            if len(items) == 3:
                break
        # Leaving the loop leaves the consume running; stop ends it (dropping 7 buffered).
        with pytest.raises(RuntimeError):
            await consumer.fetch(1, expires=1)
        consumption.stop()
        assert consumption.state is ConsumeState.STOPPED and consumer.cursor == committed[2]
        assert [item async for item in consumption] == []
        rest: list[ChangeItem] = []
        async with consumer.consume(max_messages=10, expires=2) as again:
            await collect(again, rest, lambda: len(rest) == 27)
        assert cursors(items + rest) == committed


async def test_a_publisher_restart_mid_consume_loses_and_repeats_nothing(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    path = write_config(tmp_path / "config.js", redis_server.url,
                        server={"host": "127.0.0.1", "port": free_port()})
    errors: list[BaseException] = []
    items: list[ChangeItem] = []
    async with bucket_of(load_config(path)) as bucket:
        committed = await commit(bucket, "a", 50)
        async with publisher_process(path) as first:
            consumer = PullConsumer(first.url, resource="vm", backoff=FAST,
                                    on_error=errors.append)
            async with consumer, consumer.consume(max_messages=10, expires=2) as consumption:
                consuming = asyncio.create_task(
                    collect(consumption, items, lambda: len(items) == 90))
                await eventually(lambda: len(items) >= 25, "the consume is under way")
                first.kill()  # with items buffered, and a pull in flight or about to be
                committed += await commit(bucket, "b", 20)  # while it is down
                await eventually(lambda: len(errors) >= 2, "pulls fail while it is down")
                async with publisher_process(path):
                    committed += await commit(bucket, "c", 20)  # and after it is back
                    await consuming
    assert cursors(items) == committed  # every item exactly once, in order
    assert all(isinstance(error, PullFailed) for error in errors)


async def test_a_trimmed_cursor_raises_items_missed_with_the_oldest_available(
    publisher: Service,
) -> None:
    bucket = publisher.bucket
    old = await commit(bucket, "old", 5)
    await asyncio.sleep(0.005)  # let every item become older than the 1 ms maxAge
    assert await bucket.log.trim(0.001) == 5
    new = await commit(bucket, "new", 3)
    async with PullConsumer(publisher.url, after=old[1]) as consumer:
        with pytest.raises(ItemsMissed) as caught:
            await consumer.fetch(10, expires=5)
        assert (caught.value.cursor, caught.value.oldest) == (old[1], new[0])
        assert consumer.cursor == old[1]
        with pytest.raises(ItemsMissed) as again:
            async with asyncio.timeout(scaled(10)):
                async for _ in consumer.consume():
                    pass
        assert again.value.oldest == new[0]
    # Accepting the gap: start again from the oldest retained item.
    async with PullConsumer(publisher.url) as consumer:
        assert cursors(await consumer.fetch(10, expires=5)) == new


async def test_a_missed_heartbeat_is_reported_and_the_consume_goes_on(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    path = write_config(tmp_path / "config.js", redis_server.url)
    errors: list[BaseException] = []
    items: list[ChangeItem] = []
    async with bucket_of(load_config(path)) as bucket, publisher_process(path) as frozen:
        assert frozen.process is not None
        first = await commit(bucket, "a", 1)
        consumer = PullConsumer(frozen.url, backoff=FAST, on_error=errors.append)
        async with consumer, consumer.consume(expires=1, idle_heartbeat=0.5) as consumption:
            await collect(consumption, items, lambda: len(items) == 1)
            frozen.process.send_signal(signal.SIGSTOP)
            try:
                await eventually(lambda: len(errors) >= 2, "missed heartbeats are reported",
                                 within=10)
            finally:
                frozen.process.send_signal(signal.SIGCONT)
            assert consumption.state is ConsumeState.RUNNING
            later = await commit(bucket, "b", 1)
            await collect(consumption, items, lambda: len(items) == 2)
    assert cursors(items) == first + later
    assert errors and all(isinstance(error, HeartbeatMissed) for error in errors)
    assert all(error.seconds == 1.0 for error in errors if isinstance(error, HeartbeatMissed))


async def test_a_publisher_whose_redis_is_down_is_retried(
    tcp_redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: Callable[..., Any],
) -> None:
    config = make_config(tcp_redis_server.url)
    errors: list[BaseException] = []
    async with start_publisher(config) as service:
        committed = await commit(service.bucket, "a", 3)
        async with PullConsumer(service.url, backoff=FAST, on_error=errors.append) as consumer:
            assert cursors(await consumer.fetch(10, expires=5)) == committed
            tcp_redis_server.kill()
            fetching = asyncio.create_task(consumer.fetch(10, expires=30))
            await eventually(lambda: len(errors) >= 2, "pulls fail with 503", within=10)
            tcp_redis_server.start()
            async with bucket_of(config) as bucket:
                later = await commit(bucket, "b", 1)
            async with asyncio.timeout(scaled(30)):
                assert cursors(await fetching) == later
    assert errors and all(isinstance(e, PullFailed) and e.status == 503 for e in errors)


async def test_a_closed_consumer_refuses_work_and_closing_twice_is_harmless(
    publisher: Service,
) -> None:
    consumer = PullConsumer(publisher.url, resource="vm")
    assert await consumer.fetch(1, expires=1, idle_heartbeat=0.5) == []
    await consumer.aclose()
    await consumer.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await consumer.fetch(1, expires=1)
    with pytest.raises(RuntimeError, match="closed"):
        consumer.consume(max_messages=1)


@contextlib.asynccontextmanager
async def http_server(handler: Callable[[web.Request], Any]) -> AsyncIterator[str]:
    """A real HTTP server on a free port answering `/changefeeds/events` with `handler`."""
    app = web.Application()
    app.router.add_get("/changefeeds/events", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def test_a_server_without_events_is_rejected_and_429_is_retried() -> None:
    async def not_found(request: web.Request) -> web.Response:
        return web.Response(status=404, text="no such route")

    async with http_server(not_found) as url, PullConsumer(url, backoff=FAST) as consumer:
        with pytest.raises(PullRejected) as rejected:
            await consumer.fetch(1, expires=2)
        assert rejected.value.status == 404 and "no such route" in str(rejected.value)

    calls = 0

    async def busy_then_empty(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        if calls < 3:
            return web.Response(status=429, text="slow down")
        body = {"items": [], "more": False, "oldest": "", "newest": "", "missed": False}
        return web.json_response(body)

    async with http_server(busy_then_empty) as url, PullConsumer(url, backoff=FAST) as consumer:
        assert await consumer.fetch(1, expires=3, idle_heartbeat=1) == []
    assert calls >= 3, "the 429s were retried, not raised"
