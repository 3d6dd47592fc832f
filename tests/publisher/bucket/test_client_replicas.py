"""`commit(..., replicas=N)`: a commit returns once N replicas have it (Redis WAIT), and raises
ReplicationTimeout, the commit written on the master all the same, when they do not in time."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from changefeed.errors import ReplicationTimeout
from publisher.bucket import ChangeBucket, connect
from tests.servers import RedisServer


@pytest.fixture
def master_and_replica(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RedisServer, RedisServer]]:
    master = RedisServer(tmp_path_factory.mktemp("m"), tcp=True, persist=False).start()
    replica = RedisServer(
        tmp_path_factory.mktemp("r"), tcp=True, persist=False, replica_of=master
    ).start()
    yield master, replica
    replica.stop()
    master.stop()


async def test_a_commit_with_replicas_returns_once_the_replica_has_it(
    master_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    master, replica = master_and_replica
    bucket = ChangeBucket(connect(master.url), "test")
    on_replica = ChangeBucket(connect(replica.url), "test")
    try:
        for n in range(20):
            await bucket.commit("vm", f"vm-{n}", ["nic"], {"n": n}, replicas=1)
            # No sleep, no retry: WAIT returned, so the replica has it now.
            assert await on_replica.get("vm", f"vm-{n}") == b'{"n":%d}' % n
    finally:
        await bucket.aclose()
        await on_replica.aclose()


async def test_a_replica_that_does_not_confirm_in_time_raises_with_the_cursor(
    master_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    master, replica = master_and_replica
    bucket = ChangeBucket(connect(master.url), "test")
    replica.pause()
    try:
        with pytest.raises(ReplicationTimeout) as raised:
            await bucket.commit("vm", "vm-1", ["nic"], {"n": 1}, key="k1", replicas=1,
                                replicas_timeout=0.3)
        error = raised.value
        assert (error.replicas, error.acknowledged) == (1, 0)
        assert "written on the master" in str(error)
        # Written on the master: the same key finds it, and returns the same cursor.
        assert await bucket.get("vm", "vm-1") == b'{"n":1}'
        assert await bucket.commit("vm", "vm-1", ["nic"], {"n": 1}, key="k1") == error.cursors[0]
        # Without replicas a commit does not wait for them.
        await bucket.commit("vm", "vm-2", ["nic"], {"n": 2})
    finally:
        replica.resume()
        await bucket.aclose()
    # Once the replica is back, it confirms (and has everything before).
    bucket = ChangeBucket(connect(master.url), "test")
    try:
        await bucket.commit("vm", "vm-3", ["nic"], {"n": 3}, replicas=1, replicas_timeout=5)
    finally:
        await bucket.aclose()
