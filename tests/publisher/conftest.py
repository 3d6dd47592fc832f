"""Fixtures of the bucket tests: a bucket on the test's own Redis, and a plain client beside it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from publisher.bucket import ChangeBucket, connect
from publisher.config.settings import Config
from tests.servers import RedisServer


@pytest.fixture
async def bucket(config: Config) -> AsyncIterator[ChangeBucket]:
    """A bucket named "test" with the config's resources, on the test's redis-server."""
    assert config.bucket.redis_url
    bucket = ChangeBucket(connect(config.bucket.redis_url), "test", config.resources)
    yield bucket
    await bucket.aclose()


@pytest.fixture
async def plain(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """A client of our own, to look at what the bucket stored."""
    client = aioredis.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()
