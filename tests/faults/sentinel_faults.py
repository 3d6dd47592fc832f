"""A Sentinel failover: the master SIGKILLed while a writer commits and two listeners stream.

A master, a replica and three sentinels on loopback; the publisher process and the writer reach
Redis through a `redis+sentinel://` URL. Replication is asynchronous, so the promoted replica
may lack the newest acknowledged commits: that is a rollback, which the publisher's tail and the
writer's witness turn into a new epoch (listeners get 4009 -> `Resync`), so the oracle must
count every acknowledged change received, covered, or lost-and-announced.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from tests.faults.harness import Rig, Row, Size, exercise
from tests.servers import RedisServer, SentinelServer, free_port, scaled, write_config

MASTER = "mymaster"


async def sentinel_ready(sentinels: list[SentinelServer], within: float = 20) -> None:
    """Wait until every sentinel knows the replica and the two other sentinels (a failover
    needs a quorum of 2 and a majority to elect a leader)."""
    deadline = time.monotonic() + scaled(within)
    for sentinel in sentinels:
        client = aioredis.Redis(host="127.0.0.1", port=sentinel.port)
        try:
            while True:
                masters: Any = await client.sentinel_masters()
                state = masters.get(MASTER, {})
                if state.get("num-other-sentinels", 0) >= 2 and state.get("num-slaves", 0) >= 1:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"sentinel not ready: {state}\n{sentinel.output()}")
                await asyncio.sleep(0.1)  # the sentinels' own discovery has no event to wait on
        finally:
            await client.aclose()


async def replicated_set(rig: Rig) -> tuple[RedisServer, RedisServer, list[SentinelServer]]:
    """A master, its replica and three sentinels, stopped with the rig."""
    master = RedisServer(rig.directory / "master", tcp=True, persist=False)
    await asyncio.to_thread(master.start)
    rig.stack.callback(master.stop)
    replica = RedisServer(rig.directory / "replica", tcp=True, persist=False, replica_of=master)
    await asyncio.to_thread(replica.start)
    rig.stack.callback(replica.stop)
    sentinels = []
    for n in range(3):
        sentinel = SentinelServer(rig.directory / f"sentinel{n}", master, MASTER)
        await asyncio.to_thread(sentinel.start)
        rig.stack.callback(sentinel.stop)
        sentinels.append(sentinel)
    await sentinel_ready(sentinels)
    return master, replica, sentinels


def sentinel_url(sentinels: list[SentinelServer]) -> str:
    return f"redis+sentinel://{','.join(s.address for s in sentinels)}/{MASTER}/0"


async def redis_sentinel_failover(size: Size, directory: Path) -> Row:
    """The master SIGKILLed; the sentinels promote the replica; the publisher's tail, its
    requests and the writer follow it."""
    async with Rig(directory) as rig:
        master, _, sentinels = await replicated_set(rig)
        url = sentinel_url(sentinels)
        config = write_config(directory / "config.js", url,
                              server={"host": "127.0.0.1", "port": free_port()})
        publisher = await rig.publisher(config)
        await rig.listener("a", publisher.url)
        await rig.listener("b", publisher.url)
        writer = await rig.writer(config, size)

        async def kill() -> None:
            master.kill()

        async def nothing() -> None:
            return None

        return await exercise(rig, writer, size, "redis sentinel failover (master SIGKILL)",
                              kill, nothing)
