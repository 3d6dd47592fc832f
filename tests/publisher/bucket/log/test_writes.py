"""What a failed commit tells its caller (issue 11): `BucketUnavailable` when it was never sent,
so nothing was written; `CommitOutcomeUnknown` when it was sent and no answer came, so it may
have been. Each test owns its redis-server, on TCP, to pause or kill it."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable

import pytest
import redis.exceptions

from changefeed.cursor import ZERO
from changefeed.errors import BucketUnavailable, CommitOutcomeUnknown
from publisher.bucket import Change, ChangeBucket, connect
from publisher.bucket.log.commits import Committer, StreamStats
from publisher.bucket.values.keys import Keys
from publisher.config.settings import Config
from tests.servers import RedisServer, scaled


def bucket_of(server: RedisServer, config: Config, timeout: float = 10) -> ChangeBucket:
    return ChangeBucket(connect(server.url, timeout=timeout), "test", config.resources)


async def test_a_commit_unanswered_past_the_timeout_is_outcome_unknown_and_was_written(
    tcp_redis_server: RedisServer, make_config: Callable[..., Config]
) -> None:
    config = make_config(tcp_redis_server.url)
    bucket = bucket_of(tcp_redis_server, config, timeout=scaled(0.5))
    try:
        await bucket.commit("vm", "a", ["nic"], {"n": 1})  # a pooled connection, ready
        tcp_redis_server.pause()
        try:
            with pytest.raises(CommitOutcomeUnknown, match="the commit may have been written"):
                await bucket.commit("vm", "b", ["nic"], {"n": 2}, key="req-b")
        finally:
            tcp_redis_server.resume()

        entries = await bucket.log.read(ZERO)
        assert [e.changed_resource_id for e in entries] == ["a", "b"], "it was written"
        assert await bucket.get("vm", "b") == b'{"n":2}'
        # The retry the exception asks for: the same key gives the cursor of the write.
        cursor = await bucket.commit("vm", "b", ["nic"], {"n": 2}, key="req-b")
        assert cursor == entries[1].item((await bucket.log.retention()).epoch or "").cursor
        assert len(await bucket.log.read(ZERO)) == 2
    finally:
        await bucket.aclose()


async def test_a_commit_to_a_killed_redis_is_unavailable_and_nothing_is_written(
    tcp_redis_server: RedisServer, make_config: Callable[..., Config]
) -> None:
    config = make_config(tcp_redis_server.url)
    writer = bucket_of(tcp_redis_server, config)
    await writer.commit("vm", "a", ["nic"], {"n": 1})
    await writer.aclose()
    tcp_redis_server.kill()
    bucket = bucket_of(tcp_redis_server, config)
    try:
        attempts: list[Callable[[], Awaitable[object]]] = [
            lambda: bucket.commit("vm", "b", ["nic"], {"n": 2}, key="req-b"),
            lambda: bucket.commit_many([Change.publish("vm", "c", ["nic"])] * 600, key="k"),
            lambda: bucket.publish("vm", "c", ["nic"]),
        ]
        for attempt in attempts:
            with pytest.raises(BucketUnavailable, match="Redis unreachable") as failure:
                await attempt()
            assert not isinstance(failure.value, CommitOutcomeUnknown), "it was never sent"
        tcp_redis_server.start()
        assert [e.changed_resource_id for e in await bucket.log.read(ZERO)] == ["a"]
        assert await bucket.get("vm", "b") is None
    finally:
        await bucket.aclose()


async def test_a_stream_whose_connection_closed_with_calls_in_flight_sends_no_more(
    redis_server: RedisServer,
) -> None:
    """A commit stream's connection closed under it while calls are in flight (Sentinel's pool
    closes every connection to a master it left, in use too): redis-py would open it again for
    the next call, to whichever Redis is master now, and the stream would read that call's reply
    as the reply of one sent before. The stream fails instead (outcome unknown, for the caller)."""
    client = connect(redis_server.url)
    committer = Committer(client, Keys("test"), "test", None, 100, direct=True)
    connection = await client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
    inflight: deque[tuple[bytes, int, object] | None] = deque()
    try:
        ping = (b"*1\r\n$4\r\nPING\r\n", 0, None)
        await committer._send(connection, ping, inflight, StreamStats())
        await connection.disconnect()
        with pytest.raises(redis.exceptions.ConnectionError, match="closed with commits in flight"):
            await committer._send(connection, ping, inflight, StreamStats())
        assert not connection.is_connected, "not opened again under the call in flight"
    finally:
        await client.connection_pool.release(connection)
        await client.aclose()
