"""A bucket on Redis Sentinel follows the master: connections kept to a master the sentinels
replaced are closed, those in use too, so no write goes to a master of a split brain.

Found by the nemesis (tests/faults/nemesis, seed 12): a master paused past the sentinels'
patience (or killed and started again before the failover ended) is a master of its own once
it answers again, until a sentinel demotes it, seconds later. A writer's kept connection (and a
publisher's kept tail read) went on with it: its commits were acknowledged there and thrown away
by its resync, while the other publishers read the new master.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import redis

from changefeed.cursor import Cursor
from publisher.bucket import ChangeBucket, connect
from publisher.bucket.sentinel import FOLLOW_EVERY
from tests.faults.sentinel_faults import MASTER, sentinel_ready
from tests.servers import RedisServer, SentinelServer, scaled


def _master_port(sentinel: SentinelServer) -> int:
    with redis.Redis(host="127.0.0.1", port=sentinel.port) as client:
        address = client.sentinel_get_master_addr_by_name(MASTER)
        return int(address[1])


def _has(server: RedisServer, cursor: str) -> bool:
    """Whether `server`'s log holds the entry of `cursor`."""
    position = str(Cursor.decode(cursor).position)
    with redis.Redis(host="127.0.0.1", port=server.port) as client:
        return bool(client.xrange("{test}:log", position, position))


async def test_a_kept_connection_leaves_a_master_the_sentinels_replaced(tmp_path: Path) -> None:
    master = RedisServer(tmp_path / "master", tcp=True, persist=False).start()
    replica = RedisServer(tmp_path / "replica", tcp=True, persist=False, replica_of=master)
    sentinels: list[SentinelServer] = []
    try:
        replica.start()
        for n in range(3):
            sentinels.append(SentinelServer(tmp_path / f"s{n}", master, MASTER).start())
        await sentinel_ready(sentinels)
        url = f"redis+sentinel://{','.join(s.address for s in sentinels)}/{MASTER}/0"
        bucket = ChangeBucket(connect(url), "test")
        first = await bucket.commit("vm", "a", ["nic"], {"n": 1})  # keeps a connection
        assert _has(master, first)

        master.pause()  # past the sentinels' down-after: they promote the replica
        try:
            deadline = time.monotonic() + scaled(20)
            while _master_port(sentinels[0]) != replica.port:
                assert time.monotonic() < deadline, "no failover"
                await asyncio.sleep(0.1)  # the sentinels' own timers: nothing to wait on
            await asyncio.sleep(FOLLOW_EVERY * 2.5)  # the pool's look at the sentinels
        finally:
            master.resume()  # a master of its own, until a sentinel demotes it

        after = await bucket.commit("vm", "a", ["nic"], {"n": 2})
        assert _has(replica, after), "the commit went to the master the sentinels name"
        await bucket.aclose()
    finally:
        for sentinel in sentinels:
            sentinel.stop()
        replica.stop()
        master.stop()
