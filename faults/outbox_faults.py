"""Scenarios of the PostgreSQL outbox (docs/postgres.md): the service commits to its own
PostgreSQL (a `vms` row and an outbox row per transaction,
tests/publisher/outbox/rig.py's `PgWriter`);
publisher processes relay the outbox into the bucket; listeners on them are checked by the same
oracle. A change is acknowledged when its PostgreSQL transaction committed; its cursor is the
one the relay recorded (changefeed.outbox_relayed), and a committed row that was never relayed
counts as lost.

    relaying publisher SIGKILL   two publishers share the outbox; the relaying one is killed
    PostgreSQL SIGKILL           the outbox's server killed (crash recovery) and restarted
    Redis SIGKILL, AOF           the bucket down while the service commits on
    Redis restarted empty        the store re-seeded from PostgreSQL; every listener resyncs
    LISTEN cut                   the relay's LISTEN session terminated: the poll relays
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import asyncpg

from changefeed_testing.postgres import PostgresServer
from changefeed_testing.servers import PublisherProcess, RedisServer, scaled
from faults.harness import Rig, Row, Size, Step
from faults.records import Attempt, Outcome
from publisher.outbox.status import read_status
from tests.publisher.outbox.rig import PgWriter, drained, fresh_database, outbox_section, until


async def _postgres(rig: Rig) -> tuple[PostgresServer, str]:
    """A private PostgreSQL for the scenario, and the URL of a database with the outbox."""
    server = PostgresServer()
    await asyncio.to_thread(server.start)
    rig.stack.callback(server.remove)
    return server, await fresh_database(server.url())


async def _publishers(rig: Rig, redis: RedisServer, url: str, count: int,
                      **outbox: float) -> list[PublisherProcess]:
    """`count` publishers relaying the outbox at `url`, and a listener on each ('a', 'b', ...)
    that knows every publisher's URL."""
    made = [await rig.publisher(rig.config(redis, outbox=outbox_section(url, **outbox)))
            for _ in range(count)]
    urls = [p.url for p in made]
    for n in range(count):
        await rig.listener("ab"[n], urls[n:] + urls[:n])
    return made


async def _exercise(rig: Rig, writer: PgWriter, url: str, size: Size, name: str,
                    inject: Step, heal: Step, *, after_heal: int = 20) -> Row:
    """`harness.exercise` for a PostgreSQL writer: commit in the background once every listener
    has bootstrapped; after a third of the commits `inject`, hold `size.fault` seconds, `heal`;
    commit on to `size.commits` and `after_heal` more; then resolve the cursors, settle, judge."""
    for recorder in rig.recorders:
        await recorder.bootstrapped()
    await writer.connect()
    stop = asyncio.Event()
    task = asyncio.create_task(writer.run(stop, pace=size.pace))
    try:
        await until(lambda: len(writer.committed) >= size.commits // 3, "a third committed", 60)
        await inject()
        await asyncio.sleep(size.fault)  # how long the fault lasts, not a readiness wait
        await heal()
        fault_end = time.monotonic()
        healed = len(writer.committed)
        await until(lambda: len(writer.committed) >= max(size.commits, healed + after_heal),
                    "the commits after the fault", 60)
    finally:
        stop.set()
        await task
    notes = []
    try:
        await drained(url, within=30)
    except AssertionError:
        notes.append("the outbox did not drain")
    unrelayed = await writer.resolve()
    for c in unrelayed:  # committed in PostgreSQL, never in the bucket: lost
        rig.history.attempts.append(
            Attempt(c.id, c.seq, Outcome.ACKNOWLEDGED, f"never-relayed-{c.row}", c.stamp, c.time))
    rig.history.attempts.sort(key=lambda a: a.stamp)
    await writer.close()
    behind = await rig.settle() if not unrelayed else [r.log.name for r in rig.recorders]
    return rig.row(name, fault_end, behind, notes)


async def _relaying(url: str, among: Sequence[PublisherProcess]) -> PublisherProcess:
    """The publisher of `among` holding the relay lock (waiting for one to take it)."""
    conn = await asyncpg.connect(url)
    try:
        deadline = time.monotonic() + scaled(15)
        while time.monotonic() < deadline:
            session = (await read_status(conn)).relaying or ""
            for publisher in among:
                assert publisher.process is not None
                if f"-{publisher.process.pid}-" in session:
                    return publisher
            await asyncio.sleep(0.02)
    finally:
        await conn.close()
    raise AssertionError("no publisher took the relay lock")


async def outbox_relay_kill(size: Size, directory: Path) -> Row:
    """Two publishers share the outbox; the relaying one is SIGKILLed. The other takes the lock
    within `takeoverInterval` and relays every row once (the keys absorb a re-sent one)."""
    async with Rig(directory) as rig:
        redis = await rig.redis()
        _, url = await _postgres(rig)
        publishers = await _publishers(rig, redis, url, 2)
        active = await _relaying(url, publishers)
        notes: list[str] = []

        async def kill() -> None:
            active.kill()
            killed = time.monotonic()
            await _relaying(url, [p for p in publishers if p is not active])
            notes.append(f"relay taken over in {time.monotonic() - killed:.2f} s")

        async def nothing() -> None:
            pass

        row = await _exercise(rig, PgWriter(url, rig.history), url, size,
                              "outbox: relaying publisher SIGKILL", kill, nothing)
        row.notes.extend(notes)
        return row


async def outbox_postgres_kill(size: Size, directory: Path) -> Row:
    """The outbox's PostgreSQL SIGKILLed (every backend) and restarted after `size.fault` s:
    the writer's transactions fail meanwhile (a COMMIT cut off is an unknown outcome); the
    relay reconnects, and every committed row is relayed once."""
    async with Rig(directory) as rig:
        redis = await rig.redis()
        server, url = await _postgres(rig)
        await _publishers(rig, redis, url, 1)

        async def kill() -> None:
            server.kill()

        async def restart() -> None:
            await asyncio.to_thread(server.start)

        return await _exercise(rig, PgWriter(url, rig.history), url, size,
                               "outbox: PostgreSQL SIGKILL", kill, restart)


async def outbox_redis_kill_aof(size: Size, directory: Path) -> Row:
    """The bucket's Redis (AOF, fsync always) SIGKILLed for `size.fault` s while the service
    commits on: no transaction fails, the rows wait in PostgreSQL and drain after."""
    async with Rig(directory) as rig:
        redis = await rig.redis(persist=True)
        _, url = await _postgres(rig)
        await _publishers(rig, redis, url, 1)
        writer = PgWriter(url, rig.history)

        async def kill() -> None:
            redis.kill()

        async def restart() -> None:
            await asyncio.to_thread(redis.start)

        row = await _exercise(rig, writer, url, size, "outbox: Redis SIGKILL, AOF", kill,
                              restart)
        row.notes.append(f"{writer.failed} writer transactions failed")
        return row


async def outbox_redis_empty(size: Size, directory: Path) -> Row:
    """Redis without persistence SIGKILLed and restarted empty: the relay sees the bucket's
    new epoch, re-seeds the store from the snapshot query before relaying on, and every listener
    gets a Resync. (The writer pauses across the kill: a row committed to the old Redis and not
    yet removed would be relayed again into the new one, under a new cursor.)"""
    async with Rig(directory) as rig:
        redis = await rig.redis(persist=False)
        _, url = await _postgres(rig)
        await _publishers(rig, redis, url, 1)
        writer = PgWriter(url, rig.history)

        async def kill() -> None:
            writer.paused = True
            await drained(url)
            redis.kill()

        async def restart() -> None:
            await asyncio.to_thread(redis.start)
            writer.paused = False

        return await _exercise(rig, writer, url, size, "outbox: Redis restarted empty", kill,
                               restart)


async def outbox_listen_cut(size: Size, directory: Path) -> Row:
    """The relay's LISTEN session terminated (pg_terminate_backend) every 0.3 s for
    `size.fault` s: the poll relays meanwhile, and LISTEN comes back."""
    async with Rig(directory) as rig:
        redis = await rig.redis()
        _, url = await _postgres(rig)
        await _publishers(rig, redis, url, 1, pollInterval=0.1)
        cutting: list[asyncio.Task[None]] = []

        async def cut_forever() -> None:
            conn = await asyncpg.connect(url)
            try:
                while True:
                    await conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name LIKE 'changefeed-listen %'")
                    await asyncio.sleep(0.3)
            finally:
                await conn.close()

        async def cut() -> None:
            cutting.append(asyncio.create_task(cut_forever()))

        async def stop() -> None:
            cutting[0].cancel()

        return await _exercise(rig, PgWriter(url, rig.history), url, size,
                               "outbox: LISTEN cut", cut, stop)
