"""Fixtures: a private redis-server per test, config files, and in-process publishers."""

from __future__ import annotations

import asyncio
import gc
import itertools
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from publisher.config.settings import Config, load_config
from publisher.server.service import Service
from tests.servers import RedisCluster, RedisServer, scaled, write_config

DUMP_BEFORE_TIMEOUT = 10.0
"""Seconds before a test's timeout at which its asyncio tasks' stacks are printed."""

SHARED_WORKERS = {
    "tests/publisher/spark/": "spark",
    "tests/faults/test_nemesis.py::test_a_60_second_nemesis": "nemesis",
    "tests/faults/test_nemesis.py::test_a_2_minute_soak": "nemesis",
}
"""Under pytest-xdist, the tests whose node ids begin so run on one worker, one after the other:
the Spark tests (so that one SparkSession starts, not one per worker: spark/conftest.py), and
the 60-second nemesis and the 2-minute soak (each runs three publishers and a replicated Redis).
Every other test goes to whichever worker is free."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The scheduler of `-n N` (`--dist load`, xdist's default): SHARED_WORKERS' groups."""
    if config.getvalue("dist") != "load":
        return None  # another --dist asked for
    from tests.scheduling import SharedWorkers

    return SharedWorkers(config, log, SHARED_WORKERS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """pytest-timeout's limit (`timeout` in pyproject) is a guard against a hung test, scaled
    like every other timeout of the tests (`scaled`: doubled under several xdist workers), for
    the tests that set none of their own: the first Spark test also starts Spark's JVM."""
    limit = float(config.getini("timeout") or 0)
    if limit:
        for item in items:
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(scaled(limit)))


@pytest.fixture(autouse=True)
def _tasks_dumped_before_timeout(request: pytest.FixtureRequest) -> Iterator[None]:
    """pytest-timeout prints the threads' stacks, which for an asyncio test is only the event
    loop's select: the stacks of the tasks still running, printed 10 s before the timeout, show
    what a hung test waits for (captured, and so shown with its failure)."""
    marker = request.node.get_closest_marker("timeout")
    seconds = float(marker.args[0] if marker and marker.args
                    else request.config.getini("timeout") or 0)
    if seconds <= 2 * DUMP_BEFORE_TIMEOUT:
        yield
        return
    timer = threading.Timer(seconds - DUMP_BEFORE_TIMEOUT, _dump_tasks)
    timer.daemon = True
    timer.start()
    yield
    timer.cancel()


def _dump_tasks() -> None:
    tasks = [o for o in gc.get_objects() if isinstance(o, asyncio.Task) and not o.done()]
    print(f"--- {len(tasks)} asyncio tasks running {DUMP_BEFORE_TIMEOUT:.0f} s before the "
          "test's timeout ---", file=sys.stdout, flush=True)
    for task in tasks:
        task.print_stack(file=sys.stdout)


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server on a unix socket (short path: sockets allow ~100 bytes)."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def tcp_redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server on a fixed free TCP port, so a test can kill and restart it."""
    server = RedisServer(tmp_path_factory.mktemp("redis"), tcp=True).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """One real 3-master Redis Cluster on loopback for the whole session (no test kills it);
    each test uses a bucket name of its own."""
    cluster = RedisCluster(tmp_path_factory.mktemp("cluster")).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def make_config(tmp_path: Path) -> Callable[..., Config]:
    """make_config(redis_url, **extra) writes a config.js and loads it."""
    counter = iter(range(1000))

    def make(redis_url: str | None, **extra: Any) -> Config:
        path = write_config(tmp_path / f"config{next(counter)}.js", redis_url, **extra)
        return load_config(path)

    return make


@pytest.fixture
async def layout_publisher(
    layout_config: Callable[..., Config], start_publisher: PublisherFactory
) -> AsyncIterator[Service]:
    """A publisher on a bucket of 4 partitions of `layout`."""
    async with start_publisher(layout_config(4)) as service:
        yield service


@pytest.fixture
def config(redis_server: RedisServer, make_config: Callable[..., Config]) -> Config:
    return make_config(redis_server.url)


LAYOUTS = ["redis", "cluster"]
"""Where a bucket's partitions live: one Redis (one shard, an ordered bucket), or the session's
3-master Redis Cluster (one shard per partition)."""
_bucket_names = itertools.count()


@pytest.fixture(params=LAYOUTS)
def layout(request: pytest.FixtureRequest) -> str:
    """A test that takes it runs once per layout."""
    return str(request.param)


@pytest.fixture
def layout_config(
    layout: str, request: pytest.FixtureRequest, make_config: Callable[..., Config]
) -> Callable[..., Config]:
    """layout_config(partitions=4, **extra): a config.js of a bucket of `layout` (a private
    redis-server, or a bucket of its own in the session's Redis Cluster), loaded."""

    def make(partitions: int = 4, **extra: Any) -> Config:
        bucket = {"name": f"layout{next(_bucket_names)}", "partitions": partitions}
        if layout == "redis":
            server: RedisServer = request.getfixturevalue("redis_server")
            return make_config(server.url, bucket={**bucket, "redisUrl": server.url}, **extra)
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        return make_config(None, bucket={**bucket, "cluster": cluster.node_urls}, **extra)

    return make


PublisherFactory = Callable[..., AbstractAsyncContextManager[Service]]


@pytest.fixture
def start_publisher() -> PublisherFactory:
    """`async with start_publisher(config) as service:` runs a publisher on a free port."""

    @asynccontextmanager
    async def start(config: Config) -> AsyncIterator[Service]:
        service = Service(config)
        await service.start()
        try:
            yield service
        finally:
            await service.stop()

    return start


@pytest.fixture
async def publisher(config: Config, start_publisher: PublisherFactory) -> AsyncIterator[Service]:
    async with start_publisher(config) as service:
        yield service
