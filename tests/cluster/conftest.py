"""One real 3-master Redis Cluster on loopback for the whole session (no test kills it); each
test uses a bucket of its own name."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.servers import RedisCluster

_names = itertools.count()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    cluster = RedisCluster(tmp_path_factory.mktemp("cluster")).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def bucket_name() -> str:
    """A bucket name no other test of the session uses."""
    return f"cf{next(_names)}"
