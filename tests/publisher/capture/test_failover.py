"""The capture across publisher deaths: the streaming `changefeed serve` SIGKILLed mid-stream
(its standby takes over; it comes back as a standby), every committed change still delivered
once, in commit order, to a real listener; a slot dropped by hand is found at once: a new slot,
a new copy, a new epoch, a Resync for every listener; Redis down while PostgreSQL commits on loses
nothing, and so does PostgreSQL SIGKILLed and restarted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest

from changefeed.protocol import Resource
from changefeed_testing.postgres import PostgresServer
from changefeed_testing.servers import PublisherProcess, free_port
from publisher.bucket import ChangeBucket, connect
from publisher.bucket.stores.capture_marks import CaptureMarks, Mark
from publisher.capture import pgoutput as po
from publisher.config.settings import Config
from tests.conftest import PublisherFactory
from tests.publisher.capture.rig import (
    LOGICAL,
    Writer,
    account,
    fresh_database,
    prepare,
    section_of,
    sql,
    stream_entries,
)
from tests.publisher.outbox.rig import recorder, until
from tests.servers import RedisServer, scaled, write_config

RESOURCES = [Resource("vm", ("nic", "alias", "state"), "/vms"),
             Resource("network", ("ips", "name"), "/networks")]


@pytest.fixture
async def bucket(redis_server: RedisServer) -> AsyncIterator[ChangeBucket]:
    made = ChangeBucket(connect(redis_server.url), "test", RESOURCES)
    yield made
    await made.aclose()


async def mark_of(bucket: ChangeBucket, slot: str, other_than: Mark | None = None) -> Mark:
    marks = CaptureMarks(bucket.redis, bucket.name)
    deadline = time.monotonic() + scaled(30)
    while time.monotonic() < deadline:
        mark = await marks.read(slot)
        if mark is not None and mark != other_than:
            return mark
        await asyncio.sleep(0.02)
    raise AssertionError("no (new) capture mark")


async def capture_stats(url: str) -> dict[str, object]:
    async with aiohttp.ClientSession() as session, session.get(
            f"{url}/changefeeds/stats") as reply:
        body = await reply.json()
    stats: dict[str, object] = body.get("capture", {})
    return stats


async def streaming(publishers: list[PublisherProcess]) -> PublisherProcess:
    deadline = time.monotonic() + scaled(20)
    while time.monotonic() < deadline:
        for publisher in publishers:
            try:
                stats = await capture_stats(publisher.url)
            except aiohttp.ClientError:
                continue
            if stats.get("streaming") and stats.get("transactions"):
                return publisher
        await asyncio.sleep(0.05)
    raise AssertionError("no publisher streams")


def confirmed(database: str, slot: str) -> int:
    rows = sql(database, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
               "WHERE slot_name = %s", args=(slot,))
    return po.parse_lsn(rows[0][0]) if rows else 0


async def test_exactly_once_across_a_sigkill_and_a_takeover(
    database: str, redis_server: RedisServer, bucket: ChangeBucket, tmp_path: Path,
) -> None:
    capture = prepare(database)
    publishers = [  # fixed ports: a restarted publisher comes back on its URL
        PublisherProcess(write_config(
            tmp_path / f"config{n}.js", redis_server.url, capture=section_of(capture, database),
            server={"host": "127.0.0.1", "port": free_port()})).start()
        for n in range(2)
    ]
    writer = Writer(database)
    try:
        mark = await mark_of(bucket, capture.slot)
        listener = recorder(writer.history, "a", [p.url for p in publishers])
        await listener.bootstrapped()
        stop = asyncio.Event()

        async def write() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                if n % 25 == 0:  # large transactions: the kill may land in one
                    await writer.commit([f"big-{n}-{i:03}" for i in range(300)])
                else:
                    await writer.commit([f"vm-{n % 20:03}"])
                await asyncio.sleep(0.002)

        writing = asyncio.create_task(write())
        for _ in range(2):
            victim = await streaming(publishers)
            count = len(writer.committed)
            await until(lambda c=count: len(writer.committed) > c + 150, "the writer wrote")  # type: ignore[misc]
            victim.kill()
            await until(lambda c=count: len(writer.committed) > c + 400, "the writer wrote")  # type: ignore[misc]
            victim.restart()  # a standby now
        stop.set()
        await writing
        last = writer.committed[-1].hi
        await until(lambda: confirmed(database, capture.slot) >= last, "the slot confirmed")
        assert await mark_of(bucket, capture.slot) == mark  # the same copy: no gap, no re-copy
        entries = await stream_entries(bucket, mark.head)
        assert account(writer.committed, entries, mark.lsn, writer.history, mark.epoch) == []
        assert await listener.caught_up(writer.history.attempts[-1], 30)
        verdict = writer.history.verdict()
        assert verdict.problems() == []
        assert verdict.total.lost == verdict.total.duplicated == 0
        await listener.aclose()
    finally:
        await writer.close()
        for publisher in publishers:
            publisher.stop()


async def test_a_slot_dropped_by_hand_means_a_new_copy_and_a_resync(
    database: str, redis_server: RedisServer, bucket: ChangeBucket, tmp_path: Path,
) -> None:
    capture = prepare(database)
    path = write_config(tmp_path / "config.js", redis_server.url,
                        capture=section_of(capture, database))
    publisher = PublisherProcess(path).start()
    writer = Writer(database)
    try:
        await writer.commit(["vm-1", "vm-2"])
        mark = await mark_of(bucket, capture.slot)
        listener = recorder(writer.history, "a", publisher.url)
        await listener.bootstrapped()
        await writer.commit(["vm-1"])
        await until(lambda: len(listener.log.changes) >= 1, "the listener got the change")
        deadline = time.monotonic() + scaled(20)
        while True:  # the capture reconnects at once: drop it between two of its tries
            rows = sql(database, "SELECT pg_terminate_backend(active_pid) FROM "
                       "pg_replication_slots WHERE slot_name = %s AND active", args=(capture.slot,))
            try:
                sql(database, "SELECT pg_drop_replication_slot(%s)", args=(capture.slot,))
                break
            except Exception:
                assert time.monotonic() < deadline, rows
        await writer.commit(["vm-3"])  # committed while no slot exists: in the new copy
        renewed = await mark_of(bucket, capture.slot, other_than=mark)
        assert renewed.epoch != mark.epoch and renewed.lsn > mark.lsn
        await until(lambda: len(listener.log.resyncs) >= 1, "the listener was told to resync")
        await until(lambda: len(listener.log.bootstraps) >= 2, "the listener bootstrapped again")
        assert set(listener.log.bootstraps[-1].states) == {"vm-1", "vm-2", "vm-3"}
        await listener.aclose()
    finally:
        await writer.close()
        publisher.stop()


async def test_redis_down_while_postgresql_commits_loses_nothing(
    database: str, tcp_redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    capture = prepare(database)
    config = make_config(tcp_redis_server.url, capture=section_of(capture, database))
    writer = Writer(database)
    async with start_publisher(config) as service:
        mark = await mark_of(service.bucket, capture.slot)
        stop = asyncio.Event()
        writing = asyncio.create_task(writer.run(stop))
        await until(lambda: len(writer.committed) > 50, "the writer wrote")
        tcp_redis_server.kill()
        count = len(writer.committed)
        await until(lambda: len(writer.committed) > count + 150, "PostgreSQL committed on")
        tcp_redis_server.start()  # its append-only file has every acknowledged commit
        await until(lambda: len(writer.committed) > count + 200, "the writer wrote")
        stop.set()
        await writing
        last = writer.committed[-1].hi
        await until(lambda: confirmed(database, capture.slot) >= last, "the slot confirmed",
                    within=30)
        assert service.capture is not None and service.capture.stats.bucket_errors > 0
        assert await mark_of(service.bucket, capture.slot) == mark
        entries = await stream_entries(service.bucket, mark.head)
        assert account(writer.committed, entries, mark.lsn) == []
    await writer.close()


async def test_postgresql_sigkilled_and_restarted_loses_nothing(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    server = PostgresServer(LOGICAL).start()  # its own: this test kills it
    try:
        database = fresh_database(server.url())
        capture = prepare(database)
        config = make_config(redis_server.url, capture=section_of(capture, database))
        writer = Writer(database)
        async with start_publisher(config) as service:
            mark = await mark_of(service.bucket, capture.slot)
            for n in range(50):
                await writer.commit([f"vm-{n % 10}"])
            await writer.commit([f"big-{i}" for i in range(500)])
            server.kill()  # every backend at once: crash recovery at the start
            await writer.close()
            writer.conn = None
            server.start()
            for n in range(50):
                await writer.commit([f"vm-{n % 10}"])
            last = writer.committed[-1].hi
            await until(lambda: confirmed(database, capture.slot) >= last, "the slot confirmed",
                        within=30)
            assert service.capture is not None and service.capture.stats.postgres_errors > 0
            assert await mark_of(service.bucket, capture.slot) == mark
            entries = await stream_entries(service.bucket, mark.head)
            assert account(writer.committed, entries, mark.lsn) == []
        await writer.close()
    finally:
        server.remove()
