"""The outbox under faults, with the fault suite's accounting (faults/oracle.py): every
change of a committed transaction delivered to each listener exactly once, or announced by a
Resync; nothing of a rolled-back one; per-id order kept.

    the relaying publisher SIGKILLed, another takes over        (two publishers)
    PostgreSQL SIGKILLed and restarted mid-stream
    Redis down for 10 s while the service keeps committing      (its transactions never fail)
    Redis restarted empty: the store re-seeded, one Resync

The relay killed between the bucket's commit and the rows' removal, the out-of-order commit and
the lost LISTEN are in test_relay.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import orjson
import pytest

from changefeed_testing.postgres import PostgresServer
from faults.harness import Recorder
from faults.oracle import History
from publisher.config.settings import Config
from publisher.outbox.status import read_status
from tests.conftest import PublisherFactory
from tests.publisher.outbox.rig import (
    PgWriter,
    drained,
    fresh_database,
    outbox_section,
    per_id_order,
    received,
    recorder,
    until,
)
from tests.servers import PublisherProcess, RedisServer, scaled, write_config

pytestmark = pytest.mark.faults
MakeConfig = Callable[..., Config]


@asynccontextmanager
async def writing(writer: PgWriter) -> AsyncIterator[None]:
    """`writer` commits one change every few milliseconds inside the block."""
    await writer.connect()
    stop = asyncio.Event()
    task = asyncio.create_task(writer.run(stop))
    try:
        yield
    finally:
        stop.set()
        await task


async def settle(history: History, writer: PgWriter, url: str, count: int | None = None) -> None:
    """Wait until the outbox drained and every listener delivered the relayed changes; then
    check the oracle's verdict."""
    await drained(url)
    assert await writer.resolve() == []
    await writer.close()
    owed = count if count is not None else len(history.acked)
    for rec in list(_recorders.values()):
        await received(rec, owed, within=15)
        await rec.aclose()
    _recorders.clear()
    verdict = history.verdict()
    assert verdict.problems() == [], verdict
    assert verdict.total.lost == 0 and verdict.total.duplicated == 0
    assert per_id_order(history) == []


_recorders: dict[str, Recorder] = {}


def listen(history: History, name: str, urls: str | list[str]) -> Recorder:
    rec = recorder(history, name, urls)
    _recorders[name] = rec
    return rec


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of this test's own, for a test that kills it."""
    server = PostgresServer().start()
    yield server
    server.remove()


async def test_the_relaying_publisher_killed_another_takes_over(
    database: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "c.js", redis_server.url, outbox=outbox_section(database))
    publishers = [PublisherProcess(config).start() for _ in range(2)]
    history = History()
    conn = await asyncpg.connect(database)
    try:
        rec = listen(history, "a", [p.url for p in publishers])
        await rec.bootstrapped()
        writer = PgWriter(database, history)
        async with writing(writer):
            active = await _relaying(conn, publishers)
            await until(lambda: len(writer.committed) >= 50, "50 commits")
            active.kill()
            killed = time.monotonic()
            survivor = await _relaying(conn, [p for p in publishers if p is not active])
            took_over = time.monotonic() - killed
            count = len(writer.committed)
            await until(lambda: len(writer.committed) >= count + 50, "count + 50 commits")
        assert took_over < scaled(5), took_over
        assert survivor is not active
        await settle(history, writer, database)
    finally:
        await conn.close()
        for publisher in publishers:
            publisher.stop()


async def _relaying(conn: asyncpg.Connection, among: list[PublisherProcess]) -> PublisherProcess:
    """The publisher of `among` that holds the relay lock (waiting for one to take it)."""
    deadline = time.monotonic() + scaled(10)
    while time.monotonic() < deadline:
        session = (await read_status(conn)).relaying or ""
        for publisher in among:
            assert publisher.process is not None
            if f"-{publisher.process.pid}-" in session:
                return publisher
        await asyncio.sleep(0.02)
    raise AssertionError("no publisher took the relay lock")


async def test_postgres_killed_and_restarted_mid_stream(
    private_postgres: PostgresServer, redis_server: RedisServer, make_config: MakeConfig,
    start_publisher: PublisherFactory,
) -> None:
    database = await fresh_database(private_postgres.url())
    config = make_config(redis_server.url, outbox=outbox_section(database))
    history = History()
    async with start_publisher(config) as service:
        rec = listen(history, "a", service.url)
        await rec.bootstrapped()
        writer = PgWriter(database, history)
        async with writing(writer):
            await until(lambda: len(writer.committed) >= 40, "40 commits")
            private_postgres.kill()
            await asyncio.sleep(0.3)
            private_postgres.start()
            count = len(writer.committed)
            await until(lambda: len(writer.committed) >= count + 40, "count + 40 commits")
        assert service.relay is not None and service.relay.stats.postgres_errors > 0
        await settle(history, writer, database)


async def test_redis_down_ten_seconds_the_service_keeps_committing(
    database: str, tcp_redis_server: RedisServer, make_config: MakeConfig,
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(tcp_redis_server.url, outbox=outbox_section(database))
    history = History()
    async with start_publisher(config) as service:
        rec = listen(history, "a", service.url)
        await rec.bootstrapped()
        writer = PgWriter(database, history)
        async with writing(writer):
            await until(lambda: len(writer.committed) >= 30, "30 commits")
            tcp_redis_server.kill()
            during = len(writer.committed)
            await asyncio.sleep(10)
            assert len(writer.committed) > during + 100  # committing on, Redis or not
            tcp_redis_server.start()
        assert writer.failed == 0  # no transaction failed because of Redis
        assert service.relay is not None and service.relay.stats.bucket_errors > 0
        await settle(history, writer, database)


async def test_redis_restarted_empty_reseeds_and_resyncs_once(
    database: str, tmp_path: Path, make_config: MakeConfig, start_publisher: PublisherFactory,
) -> None:
    redis = RedisServer(tmp_path / "redis", tcp=True, persist=False).start()
    try:
        config = make_config(redis.url, outbox=outbox_section(database))
        history = History()
        async with start_publisher(config) as service:
            rec = listen(history, "a", service.url)
            await rec.bootstrapped()
            writer = PgWriter(database, history, ids=8)
            await writer.connect()
            for _ in range(20):
                await writer.commit()
            await drained(database)
            await received(rec, 20)
            redis.kill()
            redis.start()
            for _ in range(20):
                await writer.commit()
            await drained(database)
            relay = service.relay
            assert relay is not None and relay.stats.reseeds == 1
            page = await service.bucket.page("vm", None, 100)
            stored = {id: orjson.loads(state) for id, state in zip(page.ids, page.states,
                                                                    strict=True)}
            truth = dict(await writer.conn.fetch("SELECT uuid, state::text FROM vms"))
            assert stored == {id: orjson.loads(state) for id, state in truth.items()}
            assert await rec.wait(  # told, and bootstrapped again
                lambda: bool(rec.log.resyncs) and len(rec.log.bootstraps) >= 2, 10)
            await settle(history, writer, database, count=0)
            assert len(history.listeners["a"].resyncs) == 1
    finally:
        redis.stop()
