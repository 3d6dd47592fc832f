"""Scenarios that hurt Redis: SIGSTOP, SIGKILL without persistence, SIGKILL with an append-only
file, and a restore from an older RDB snapshot (the bucket's head goes backwards).

Each runs one publisher process on its own redis-server, two listeners on it, and a writer in
the test process; see `harness.exercise` for the common shape.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
from pathlib import Path

import redis

from changefeed_testing.servers import PublisherProcess, RedisServer, scaled
from faults.harness import PATIENT, Rig, Row, Size, exercise, writing


async def _one_publisher(rig: Rig, server: RedisServer) -> tuple[Path, PublisherProcess]:
    config = rig.config(server)
    publisher = await rig.publisher(config)
    await rig.listener("a", publisher.url)
    await rig.listener("b", publisher.url)
    return config, publisher


async def _restart(server: RedisServer) -> None:
    await asyncio.to_thread(server.start)


async def redis_sigstop(size: Size, directory: Path) -> Row:
    """Redis paused (SIGSTOP) for `size.fault` seconds: commits wait, nothing is lost."""
    async with Rig(directory) as rig:
        server = await rig.redis()
        config, _ = await _one_publisher(rig, server)

        async def pause() -> None:
            server.pause()

        async def resume() -> None:
            server.resume()

        return await exercise(rig, await rig.writer(config, size), size, "redis SIGSTOP",
                              pause, resume)


async def redis_kill_no_persistence(size: Size, directory: Path) -> Row:
    """Redis without persistence SIGKILLed and restarted empty: acknowledged changes not yet
    delivered are gone; the bucket comes back with a new epoch, which must be announced
    (4009 -> `Resync`)."""
    async with Rig(directory) as rig:
        server = await rig.redis(persist=False)
        config, _ = await _one_publisher(rig, server)

        async def kill() -> None:
            server.kill()

        return await exercise(rig, await rig.writer(config, size), size,
                              "redis SIGKILL, no persistence", kill, lambda: _restart(server))


async def redis_kill_aof(size: Size, directory: Path) -> Row:
    """Redis with `appendfsync always` SIGKILLed and restarted on the same port: every
    acknowledged change survives and is delivered once."""
    async with Rig(directory) as rig:
        server = await rig.redis(persist=True)
        config, _ = await _one_publisher(rig, server)

        async def kill() -> None:
            server.kill()

        return await exercise(rig, await rig.writer(config, size), size,
                              "redis SIGKILL, AOF fsync always", kill,
                              lambda: _restart(server))


def _save(server: RedisServer) -> Path:
    """SAVE an RDB snapshot now and keep a copy of it."""
    with redis.Redis.from_url(server.url) as client:
        client.save()
    kept = server.directory / "older.rdb"
    shutil.copy(server.directory / "dump.rdb", kept)
    return kept


async def redis_rollback(size: Size, directory: Path) -> Row:
    """Redis restored from an older RDB snapshot: the changes acknowledged after the snapshot
    are gone from the log and the store, and the head goes back.

    The publisher is paused (SIGSTOP) from the snapshot until Redis is back, so its tail has not
    read the changes that the rollback removes: its listeners can only learn of them from an
    announcement (a new epoch and `Resync`)."""
    async with Rig(directory) as rig:
        server = await rig.redis(persist=False)  # loads dump.rdb at start
        config = rig.config(server)
        publisher = await rig.publisher(config)
        assert publisher.process is not None
        await rig.listener("a", publisher.url, PATIENT)
        await rig.listener("b", publisher.url, PATIENT)
        for recorder in rig.recorders:
            await recorder.bootstrapped()
        writer = await rig.writer(config, size)
        target = size.commits
        async with writing(writer, lambda: writer.acked >= target):
            await writer.wait_acked(size.commits // 3)
            publisher.process.send_signal(signal.SIGSTOP)
            try:
                older = await asyncio.to_thread(_save, server)
                await writer.wait_acked(writer.acked + size.commits // 3)
                server.kill()
                shutil.copy(older, server.directory / "dump.rdb")
                await _restart(server)
            finally:
                publisher.process.send_signal(signal.SIGCONT)
            fault_end = time.monotonic()
            target = max(size.commits, writer.acked + 20)  # `done` reads the new target
        behind = await rig.settle()
        return rig.row("redis restored from an older RDB", fault_end, behind)


async def commit_reply_lost(size: Size, directory: Path) -> Row:
    """The writer reaches Redis through a proxy. Its replies are held back until one is held
    (Redis ran that commit), then the connection is reset: the commit was written, but the
    writer never got its cursor. It must be told "outcome unknown", not "nothing written"."""
    async with Rig(directory) as rig:
        server = await rig.redis()
        config, _ = await _one_publisher(rig, server)
        proxy = await rig.proxy(server.url)
        writer = await rig.writer(config, size, f"redis://127.0.0.1:{proxy.port}/0")

        async def lose_a_reply() -> None:
            proxy.blackhole(replies_only=True)
            async with asyncio.timeout(scaled(10)):
                await proxy.holding.wait()
            proxy.cut(refuse_new=False)

        async def nothing() -> None:
            pass

        return await exercise(rig, writer, size, "commit reply lost (reset after the write)",
                              lose_a_reply, nothing)
