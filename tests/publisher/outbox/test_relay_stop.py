"""Stopping the relay ends it promptly whatever PostgreSQL does: a backend that no longer
answers (SIGSTOPped) holds no stop up longer than a close's timeout; a stop that comes while a
failed session is ending, or in the same turn of the loop as a wake-up of the poll, is not lost
(the relay does not go on)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest

from changefeed_testing.postgres import PostgresServer
from publisher.config.settings import Config
from publisher.outbox.database import CLOSE_TIMEOUT
from publisher.outbox.relay import Relay
from tests.conftest import PublisherFactory
from tests.publisher.outbox.rig import fresh_database, outbox_section
from tests.servers import RedisServer, eventually, scaled

MakeConfig = Callable[..., Config]
BACKEND = "SELECT pid FROM pg_stat_activity WHERE application_name LIKE $1"


@asynccontextmanager
async def paused(pids: list[int]) -> AsyncIterator[None]:
    """The processes `pids` (PostgreSQL backends) SIGSTOPped inside the block."""
    stopped = []
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        yield
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)


async def stopped_within(relay: Relay, seconds: float) -> float:
    """Stop `relay`, failing when it takes longer than `seconds` (scaled); the time it took."""
    task = relay._task
    assert task is not None and not task.done()
    started = time.monotonic()
    stopping = asyncio.create_task(relay.stop())  # not cancelled by the wait's timeout
    done, _ = await asyncio.wait({stopping}, timeout=scaled(seconds))
    if not done:
        task.cancel()  # a second cancellation, for the teardown (the service's asks once)
        await asyncio.wait({stopping})
        raise AssertionError(f"the relay did not stop within {scaled(seconds)} s")
    await stopping
    assert task.cancelled()
    return time.monotonic() - started


async def test_a_stop_while_a_failed_session_ends_is_not_lost(
    database: str, redis_server: RedisServer, make_config: MakeConfig,
    start_publisher: PublisherFactory,
) -> None:
    """The relay's session fails (its backend terminated) while its LISTEN connection's close
    waits on a backend that does not answer; the stop comes meanwhile."""
    config = make_config(redis_server.url, outbox=outbox_section(database, pollInterval=0.1))
    conn = await asyncpg.connect(database)
    try:
        async with start_publisher(config) as service:
            relay = service.relay
            assert relay is not None
            await eventually(lambda: relay.stats.relaying and relay.stats.listening,
                             "the relay relays and listens")
            listening = await conn.fetchval(BACKEND, "changefeed-listen %")
            async with paused([listening]):
                cut = await conn.fetchval(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name LIKE 'changefeed-relay %'"
                )
                assert cut == 1
                relay.wake()  # its next statement fails: the session ends, closing LISTEN's
                await eventually(lambda: not relay.stats.listening, "the session ends")
                took = await stopped_within(relay, 3 * CLOSE_TIMEOUT)
            assert took < scaled(2 * CLOSE_TIMEOUT), took
    finally:
        await conn.close()


def waits_for_a_wake(task: asyncio.Task[None]) -> bool:
    """The relay's task waits in its poll for a wake-up (the coroutines it awaits, innermost
    last, end in the wait)."""
    names = []
    coroutine: Any = task.get_coro()
    while coroutine is not None and hasattr(coroutine, "cr_code"):
        names.append(coroutine.cr_code.co_name)
        coroutine = coroutine.cr_await
    return "_relay" in names and names[-1] in ("wait", "wait_for")


async def test_a_stop_racing_a_wake_up_is_not_lost(
    database: str, redis_server: RedisServer, make_config: MakeConfig,
    start_publisher: PublisherFactory,
) -> None:
    """The poll's wait woken (a notification) in the same turn of the loop as the relay's task
    is cancelled (the service cancels it once): asyncio.wait_for returned the wake-up, and the
    relay went on."""
    config = make_config(redis_server.url, outbox=outbox_section(database, pollInterval=60))
    async with start_publisher(config) as service:
        relay = service.relay
        assert relay is not None and relay._task is not None
        task = relay._task
        await eventually(lambda: relay.stats.relaying and relay.stats.listening,
                         "the relay relays and listens")
        await eventually(lambda: waits_for_a_wake(task), "the relay waits for a wake-up")
        relay.wake()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=scaled(3))
        if not done:
            task.cancel()  # a second cancellation, for the teardown
            await asyncio.wait({task})
            raise AssertionError("the relay did not stop when cancelled")
        assert task.cancelled()


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of this test's own, for a test that pauses it whole."""
    server = PostgresServer().start()
    yield server
    server.remove()


async def test_a_relay_stops_while_postgres_does_not_answer(
    private_postgres: PostgresServer, redis_server: RedisServer, make_config: MakeConfig,
    start_publisher: PublisherFactory,
) -> None:
    """Every process of PostgreSQL SIGSTOPped, the relay mid-statement: the stop drops the
    connections after CLOSE_TIMEOUT at most each (a graceful close waits on the server)."""
    database = await fresh_database(private_postgres.url())
    config = make_config(redis_server.url, outbox=outbox_section(database, pollInterval=0.1))
    async with start_publisher(config) as service:
        relay = service.relay
        assert relay is not None
        await eventually(lambda: relay.stats.relaying and relay.stats.listening,
                         "the relay relays and listens")
        assert private_postgres.process is not None
        os.killpg(private_postgres.process.pid, signal.SIGSTOP)
        try:
            relay.wake()  # a claim that the server never answers
            await asyncio.sleep(0.05)  # not readiness: a claim in flight or not, both must stop
            took = await stopped_within(relay, 4 * CLOSE_TIMEOUT)
        finally:
            os.killpg(private_postgres.process.pid, signal.SIGCONT)
        assert took < scaled(3 * CLOSE_TIMEOUT), took
