"""The bucket's small stores of bucket-wide keys (`bucket.fleet`, `bucket.ledgers`,
`bucket.cursor_sets`): one of each per bucket, their keys under the bucket's hash tag, and
redis-py's errors translated into ours when Redis is gone. What each stores is tested with its
user: tests/publisher/web/test_fleet.py, test_feed.py, tests/publisher/spark/test_sink.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest
import redis.asyncio as aioredis

from changefeed.errors import BucketUnavailable
from publisher.bucket import ChangeBucket, connect
from publisher.config.settings import Config
from tests.servers import RedisServer


async def test_each_store_is_one_object_of_its_bucket(bucket: ChangeBucket) -> None:
    assert bucket.fleet is bucket.fleet
    assert bucket.ledgers is bucket.ledgers
    assert bucket.cursor_sets is bucket.cursor_sets


async def test_the_stores_keep_their_keys_under_the_buckets_hash_tag(
    bucket: ChangeBucket, plain: aioredis.Redis
) -> None:
    await bucket.fleet.advertise("p-1", b'{"listeners": 0}', ttl=10)
    await bucket.ledgers.record_batch("q", 0, "summary", retain=10)
    assert await bucket.ledgers.record_txn("app", 3, "1 a b", ttl_ms=60_000) == "3 1 a b"
    assert await bucket.cursor_sets.save_cursors("c", "s", {0: "e.1-0"}, max_age=60, most=2)

    keys = sorted(key.decode() for key in cast(list[bytes], await plain.keys("*")))
    assert keys == [
        "{test}:cursorset:c:s", "{test}:cursorsets:c", "{test}:publisher:p-1",
        "{test}:publishers", "{test}:spark:q", "{test}:sparktxn:app",
    ]
    assert await bucket.ledgers.ledger("q") == {0: "summary"}
    assert await bucket.cursor_sets.load_cursors("c", "s", [0, 1]) == {0: "e.1-0", 1: None}
    await bucket.fleet.withdraw("p-1")
    assert await bucket.fleet.publishers() == []


async def test_the_stores_say_the_bucket_is_unavailable_when_redis_is_gone(
    tcp_redis_server: RedisServer, make_config: Callable[..., Config]
) -> None:
    config = make_config(tcp_redis_server.url)
    bucket = ChangeBucket(connect(tcp_redis_server.url, timeout=2), "test", config.resources)
    try:
        tcp_redis_server.kill()
        with pytest.raises(BucketUnavailable, match=r"^advertise: Redis unreachable"):
            await bucket.fleet.advertise("p-1", b"{}", ttl=10)
        with pytest.raises(BucketUnavailable, match=r"^publishers: Redis unreachable"):
            await bucket.fleet.publishers()
        with pytest.raises(BucketUnavailable, match=r"^spark ledger: Redis unreachable"):
            await bucket.ledgers.batch_recorded("q", 0)
        with pytest.raises(BucketUnavailable, match=r"^spark txn: Redis unreachable"):
            await bucket.ledgers.record_txn("app", 1, "0 - -", ttl_ms=1000)
        with pytest.raises(BucketUnavailable, match=r"^cursorset: Redis unreachable"):
            await bucket.cursor_sets.save_cursors("c", "s", {0: "e.1-0"}, max_age=60, most=2)
    finally:
        await bucket.aclose()
