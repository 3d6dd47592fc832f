"""A bucket on Redis Sentinel follows the master: connections kept to a master the sentinels
replaced are closed, those in use too, so no write goes to a master of a split brain.

Found by the nemesis (faults/nemesis, seed 12): a master paused past the sentinels'
patience (or killed and started again before the failover ended) is a master of its own once
it answers again, until a sentinel demotes it, seconds later. A writer's kept connection (and a
publisher's kept tail read) went on with it: its commits were acknowledged there and thrown away
by its resync, while the other publishers read the new master.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from changefeed.cursor import Position
from changefeed.errors import BucketUnavailable, CommitOutcomeUnknown
from faults.sentinel_faults import MASTER, sentinel_ready
from publisher.bucket import ChangeBucket, connect
from publisher.bucket.redis import sentinel as sentinel_module
from publisher.bucket.redis.sentinel import FOLLOW_EVERY
from tests.servers import RedisServer, SentinelServer, scaled


def _master_port(sentinel: SentinelServer) -> int:
    with redis.Redis(host="127.0.0.1", port=sentinel.port) as client:
        address = client.sentinel_get_master_addr_by_name(MASTER)
        return int(address[1])


def _has(server: RedisServer, cursor: str) -> bool:
    """Whether `server`'s log holds the entry of `cursor`."""
    position = str(Position.decode(cursor).position)
    with redis.Redis(host="127.0.0.1", port=server.port) as client:
        return bool(client.xrange("{test}:log", position, position))


@dataclass
class Trio:
    """A master, its replica and three sentinels watching them, with the bucket's URL."""

    master: RedisServer
    replica: RedisServer
    sentinels: list[SentinelServer]

    @property
    def url(self) -> str:
        return f"redis+sentinel://{','.join(s.address for s in self.sentinels)}/{MASTER}/0"

    async def fail_over(self, *, everywhere: bool) -> None:
        """Wait until the sentinels name the replica (the master is paused): the first
        sentinel, or every one of them when `everywhere`."""
        deadline = time.monotonic() + scaled(20)
        asked = self.sentinels if everywhere else self.sentinels[:1]
        while any(_master_port(s) != self.replica.port for s in asked):
            assert time.monotonic() < deadline, "no failover"
            await asyncio.sleep(0.1)  # the sentinels' own timers: nothing to wait on


@contextlib.asynccontextmanager
async def trio(directory: Path) -> AsyncIterator[Trio]:
    master = RedisServer(directory / "master", tcp=True, persist=False).start()
    replica = RedisServer(directory / "replica", tcp=True, persist=False, replica_of=master)
    sentinels: list[SentinelServer] = []
    try:
        replica.start()
        for n in range(3):
            sentinels.append(SentinelServer(directory / f"s{n}", master, MASTER).start())
        await sentinel_ready(sentinels)
        yield Trio(master, replica, sentinels)
    finally:
        for sentinel in sentinels:
            sentinel.stop()
        replica.stop()
        master.stop()


async def test_a_kept_connection_leaves_a_master_the_sentinels_replaced(tmp_path: Path) -> None:
    async with trio(tmp_path) as servers:
        bucket = ChangeBucket(connect(servers.url), "test")
        first = await bucket.commit("vm", "a", ["nic"], {"n": 1})  # keeps a connection
        assert _has(servers.master, first)

        servers.master.pause()  # past the sentinels' down-after: they promote the replica
        try:
            await servers.fail_over(everywhere=False)
            await asyncio.sleep(FOLLOW_EVERY * 2.5)  # the pool's look at the sentinels
        finally:
            servers.master.resume()  # a master of its own, until a sentinel demotes it

        after = await bucket.commit("vm", "a", ["nic"], {"n": 2})
        assert _has(servers.replica, after), "the commit went to the master the sentinels name"
        await bucket.aclose()


async def test_a_new_connection_that_finds_a_new_master_closes_those_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py's look at the sentinels (a new connection's) records the new master and closes
    only idle connections; one in use then stayed on the old master, and the pool's own look,
    finding the address already recorded, saw no change (the nemesis, seed 12: a publisher
    read two masters by turns and served two epochs). The pool's own look is kept away here:
    the new connection's look alone must close it."""
    monkeypatch.setattr(sentinel_module, "FOLLOW_EVERY", 3600.0)
    async with trio(tmp_path) as servers:
        client = connect(servers.url)
        pool = client.connection_pool
        # In use throughout, as a tail's read is.
        kept = await pool.get_connection()  # type: ignore[no-untyped-call]
        await kept.send_command("PING")
        assert await kept.read_response() in (b"PONG", "PONG")
        assert kept.port == servers.master.port

        servers.master.pause()
        try:
            await servers.fail_over(everywhere=True)
            # A new connection: redis-py's look at the sentinels.
            other = await pool.get_connection()  # type: ignore[no-untyped-call]
            assert other.port == servers.replica.port
            await pool.release(other)
        finally:
            servers.master.resume()  # a master of its own, until a sentinel demotes it

        assert not kept.is_connected, "the connection in use to the old master was closed"
        await pool.release(kept)
        # Taken again, it connects again: to the master the sentinels name.
        again = await pool.get_connection()  # type: ignore[no-untyped-call]
        await again.send_command("SET", "{test}:probe", "1")  # a write: refused by a replica
        await again.read_response()
        assert again.port == servers.replica.port
        await pool.release(again)
        await client.aclose()


async def test_a_read_on_a_connection_closed_for_the_old_master_goes_to_the_new_one(
    tmp_path: Path,
) -> None:
    """Reads go on while the master is paused past the sentinels' patience and the replica is
    promoted (its bucket starts a new epoch, as a writer's witness would make it); the pool
    closes its connections to the old master, those in use too. A read in flight on one of
    them is sent again by redis-py on the same connection object: it must open to the new
    master, not to the address it had. Before, it went back to the old master, which took the
    connection in the kernel and answered once resumed, a master of its own until demoted:
    reads of the old epoch for a second or more (the nemesis's 30-minute soak, seed 12)."""
    async with trio(tmp_path) as servers:
        bucket = ChangeBucket(connect(servers.url), "test")
        await bucket.commit("vm", "a", ["nic"], {"n": 1})
        old = await bucket.log.current_epoch()
        read: list[tuple[float, str | None]] = []

        async def reading() -> None:
            while True:
                with contextlib.suppress(BucketUnavailable):
                    read.append((time.monotonic(), (await bucket.log.retentions())[0].epoch))
                await asyncio.sleep(0.02)

        reader = asyncio.create_task(reading())
        try:
            await asyncio.sleep(0.2)
            servers.master.pause()
            try:
                await servers.fail_over(everywhere=True)
                new = await bucket.log.renew_epoch(old or "")
            finally:
                servers.master.resume()
            resumed = time.monotonic()
            await asyncio.sleep(scaled(2))
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        after = [epoch for at, epoch in read if at > resumed]
        assert after and new != old
        assert set(after) == {new}, f"read the old master's epoch {old} after the failover"
        await bucket.aclose()


async def test_with_every_sentinel_down_a_commit_says_it_was_not_written(tmp_path: Path) -> None:
    """No sentinel answers: a connection kept to the master goes on (the pool's look fails and
    changes nothing); one opened now cannot learn where the master is, so the commit fails at
    once with BucketUnavailable (nothing written: not CommitOutcomeUnknown) naming the master
    asked for; once a sentinel is back, commits go on."""
    async with trio(tmp_path) as servers:
        bucket = ChangeBucket(connect(servers.url), "test")
        await bucket.commit("vm", "a", ["nic"], {"n": 1})  # keeps a connection
        for sentinel in servers.sentinels:
            sentinel.stop()
        await asyncio.sleep(FOLLOW_EVERY * 1.5)  # the pool looks, and no sentinel answers
        kept = await bucket.commit("vm", "a", ["nic"], {"n": 2})
        assert _has(servers.master, kept), "the kept connection went on"

        await bucket.redis.connection_pool.disconnect()  # the next commit must ask
        asked = time.monotonic()
        with pytest.raises(BucketUnavailable) as refused:
            await bucket.commit("vm", "a", ["nic"], {"n": 3}, key="k3")
        # Each sentinel refuses at once and is asked once (redis-py's default retries, with
        # their backoff, took 24 s): a bound on the failure's wait, not a measure of speed.
        assert time.monotonic() - asked < scaled(5)
        assert not isinstance(refused.value, CommitOutcomeUnknown)
        assert "mymaster" in str(refused.value), str(refused.value)

        servers.sentinels[2].start()  # one is enough to name the master
        third = await bucket.commit("vm", "a", ["nic"], {"n": 3}, key="k3")
        assert _has(servers.master, third)
        newer = await bucket.log.read(Position.decode(kept).position)
        assert len(newer) == 1, "the refused commit was not written"
        await bucket.aclose()


async def test_closing_ends_the_pools_look_even_if_its_cancellation_comes_out_as_a_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failpoint: the look at the sentinels turns the cancellation `aclose` sends it into a
    timeout, as a cancellation that meets redis-py's timeout around the sentinels' answer can.
    The look catches timeouts (a sentinel that does not answer), so it went on for ever and
    `aclose` waited for it: the fault suite's Sentinel failover hung (twice in some hundred
    runs). Closing must end it all the same."""
    monkeypatch.setattr(sentinel_module, "FOLLOW_EVERY", 0.01)
    pool = sentinel_module.sentinel_pool(f"redis+sentinel://127.0.0.1:1/{MASTER}")
    asked = asyncio.Event()

    async def discover_master(service_name: str) -> tuple[str, int]:
        asked.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise TimeoutError("the sentinels did not answer in time") from None
        raise AssertionError("unreachable")

    monkeypatch.setattr(pool.sentinel_manager, "discover_master", discover_master)
    pool._follower = asyncio.get_running_loop().create_task(pool._follow())
    await asyncio.wait_for(asked.wait(), scaled(5))
    await asyncio.wait_for(pool.aclose(), scaled(5))
    assert pool._follower.done()
