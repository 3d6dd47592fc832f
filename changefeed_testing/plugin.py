"""The pytest plugin of the testing kit: a real Redis and a real publisher per test.

Installed with the package (the `pytest11` entry point `changefeed`), so its fixtures are there
in every test session of an environment that has changefeed installed:

- `changefeed_settings`: config.js keys merged over the kit's defaults (override it);
- `changefeed_redis`: a private redis-server (`RedisServer`) on a unix socket;
- `changefeed_publisher`: `changefeed serve` in a subprocess on it (`RunningPublisher`);
- `changefeed_bucket`: a `publisher.ChangeBucket` on that bucket (needs pytest-asyncio);
- `changefeed_faults`: the fault helpers (`Faults`): restart, pause, trim, slow socket.

All are function-scoped: every test gets its own Redis and publisher.

Loading the plugin costs an import of the standard library and orjson only: the publisher and
the listener are imported when a fixture is first used. docs/testing.md has a worked example.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from changefeed_testing.faults import Faults
from changefeed_testing.running import RunningPublisher
from changefeed_testing.servers import RedisServer

if TYPE_CHECKING:
    from publisher import ChangeBucket


@pytest.fixture
def changefeed_settings() -> dict[str, Any]:
    """config.js keys for the kit's publisher, merged over its defaults (resources `vm` with
    `nic`, `alias`, `state` and `network` with `ips`, `name`; `maxAge` 3600). Override this
    fixture in a conftest.py, or per test with `@pytest.mark.parametrize("changefeed_settings",
    [{...}])`, to serve your own resources or limits."""
    return {}


@pytest.fixture
def changefeed_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server on a unix socket, without persistence; stopped after the test."""
    server = RedisServer(tmp_path_factory.mktemp("cf-redis"), persist=False).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def changefeed_publisher(
    changefeed_redis: RedisServer,
    changefeed_settings: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningPublisher]:
    """A publisher subprocess on `changefeed_redis`: `.url` for listeners, `.config`,
    `.config_path`, `.redis_url`, `.bucket()`. Stopped (SIGTERM) after the test."""
    running = RunningPublisher.start(
        tmp_path_factory.mktemp("cf-publisher"), changefeed_redis.url, changefeed_settings
    )
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def changefeed_faults(
    changefeed_redis: RedisServer, changefeed_publisher: RunningPublisher
) -> Faults:
    """Fault helpers for `changefeed_publisher` and its Redis: `restart_publisher()`,
    `pause_redis(seconds)` / `redis_paused()`, `trim_past(cursor)`, `slow_socket(rate)`."""
    return Faults(changefeed_redis, changefeed_publisher)


try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - the kit's own tests run with pytest-asyncio

    @pytest.fixture(name="changefeed_bucket")
    def _bucket_needs_pytest_asyncio() -> None:
        """Needs pytest-asyncio (`pip install pytest-asyncio`)."""
        pytest.fail("the changefeed_bucket fixture needs pytest-asyncio installed")

else:

    @pytest_asyncio.fixture(name="changefeed_bucket")
    async def _bucket(changefeed_publisher: RunningPublisher) -> AsyncIterator[ChangeBucket]:
        """A `publisher.ChangeBucket` on the publisher's bucket, with its resources: commit
        changes from the test (`await changefeed_bucket.commit("vm", id, ["nic"], state)`)."""
        async with changefeed_publisher.bucket() as bucket:
            yield bucket
