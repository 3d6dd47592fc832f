"""A Sentinel failover: the master SIGKILLed while a writer commits and two listeners stream.

A master, a replica and three sentinels on loopback; the publisher process and the writer reach
Redis through a `redis+sentinel://` URL. Replication is asynchronous, so the promoted replica
may lack the newest acknowledged commits: that is a rollback, which the publisher's tail and the
writer's witness turn into a new epoch (listeners get 4009 -> `Resync`), so the oracle must
count every acknowledged change received, covered, or lost-and-announced. The writer retries
each commit with its idempotency key until it is acknowledged.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from changefeed.errors import BucketUnavailable
from changefeed_testing.proxy import Proxy
from changefeed_testing.servers import RedisServer, SentinelServer, free_port, scaled, write_config
from faults.harness import (
    RESOURCE,
    SUBS,
    Rig,
    Row,
    Size,
    Writer,
    exercise,
    outcome_unknown,
)
from faults.records import Attempt

MASTER = "mymaster"
RETRY_FOR = 20.0
"""Seconds a writer keeps retrying one commit (a failover takes 2 to 3)."""


class KeyedWriter(Writer):
    """A writer that retries each commit with its idempotency key until it is acknowledged, as a
    service would across a failover. A try whose outcome is unknown is recorded as such (it may
    have been written on the old master and delivered before the failover)."""

    async def commit(self) -> Attempt:
        self.seq += 1
        seq, id = self.seq, f"vm-{self.seq % self.ids:03}"
        key = f"writer-{seq}"
        deadline = time.monotonic() + scaled(RETRY_FOR)
        while True:
            try:
                cursor = await self.bucket.commit(RESOURCE, id, SUBS, {"uuid": id, "seq": seq},
                                                  key=key)
                break
            except BucketUnavailable as error:
                self.failures += 1
                if outcome_unknown(error):
                    self.history.unknown(id, seq, time.monotonic())
                if time.monotonic() > deadline:
                    return self.history.failed(id, seq, time.monotonic())
                await asyncio.sleep(0.05)  # a writer's backoff while the sentinels fail over
        attempt = self.history.acknowledged(id, seq, cursor, time.monotonic())
        self.acked += 1
        self.last = attempt
        async with self._progress:
            self._progress.notify_all()
        return attempt


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


async def replicated_set(
    rig: Rig, *, through_proxy: bool = False
) -> tuple[RedisServer, RedisServer, list[SentinelServer], Proxy | None]:
    """A master, its replica and three sentinels, stopped with the rig; `through_proxy`: the
    replica replicates through a proxy the scenario can blackhole and cut."""
    master = RedisServer(rig.directory / "master", tcp=True, persist=False)
    await asyncio.to_thread(master.start)
    rig.stack.callback(master.stop)
    proxy = await rig.proxy(master.url) if through_proxy else None
    replica = RedisServer(rig.directory / "replica", tcp=True, persist=False, replica_of=master,
                          replica_via=None if proxy is None else proxy.port)
    await asyncio.to_thread(replica.start)
    rig.stack.callback(replica.stop)
    sentinels = []
    for n in range(3):
        sentinel = SentinelServer(rig.directory / f"sentinel{n}", master, MASTER)
        await asyncio.to_thread(sentinel.start)
        rig.stack.callback(sentinel.stop)
        sentinels.append(sentinel)
    await sentinel_ready(sentinels)
    return master, replica, sentinels, proxy


def sentinel_url(sentinels: list[SentinelServer]) -> str:
    return f"redis+sentinel://{','.join(s.address for s in sentinels)}/{MASTER}/0"


async def redis_sentinel_failover(size: Size, directory: Path) -> Row:
    """The master SIGKILLed; the sentinels promote the replica; the publisher's tail, its
    requests and the writer follow it."""
    return await _failover(size, directory, lagging=False)


async def redis_sentinel_failover_lagging(size: Size, directory: Path) -> Row:
    """The replica's link blackholed for a moment (the master acknowledges commits it does not
    have), then the master SIGKILLed and the link cut: the promoted replica lacks acknowledged
    commits. A rollback, which must be announced (new epoch, 4009, `Resync`)."""
    return await _failover(size, directory, lagging=True)


async def _failover(size: Size, directory: Path, *, lagging: bool) -> Row:
    async with Rig(directory) as rig:
        master, _, sentinels, proxy = await replicated_set(rig, through_proxy=lagging)
        url = sentinel_url(sentinels)
        config = write_config(directory / "config.js", url,
                              server={"host": "127.0.0.1", "port": free_port()})
        publisher = await rig.publisher(config)
        await rig.listener("a", publisher.url)
        await rig.listener("b", publisher.url)
        writer = KeyedWriter(await rig.bucket(config), rig.history, pace=size.pace)

        async def kill() -> None:
            if proxy is not None:
                proxy.blackhole()
                acked = writer.acked
                await writer.wait_acked(acked + 20)  # acknowledged, never replicated
            master.kill()
            if proxy is not None:
                proxy.cut()  # what the proxy held back never reaches the replica

        async def nothing() -> None:
            return None

        name = "redis sentinel failover, " + (
            "replica lagging (master SIGKILL)" if lagging else "master SIGKILL"
        )
        return await exercise(rig, writer, size, name, kill, nothing)
