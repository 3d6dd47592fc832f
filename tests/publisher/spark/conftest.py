"""One local SparkSession for the whole test session (Spark takes seconds to start).

The session is not given the data source by `register(spark)`: Spark finds it by itself, through
the top-level module `pyspark_changefeed` (docs/spark.md), so every test also checks that.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from tests.servers import RedisServer, write_config


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """local[2,2]: two cores, and a failed task is tried once more, as on a cluster."""
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers import this venv's packages
    # An editable install is found through an import hook, which Spark's search for pyspark_*
    # modules (pkgutil.iter_modules over the path) does not see: put the checkout on the path.
    root = str(Path(__file__).resolve().parents[3])
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("changefeed-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=error")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def options(redis_server: RedisServer) -> dict[str, str]:
    """The data source options naming the test bucket by URL (no resources checked)."""
    return {"redisUrl": redis_server.url, "bucket": "test"}


@pytest.fixture
def config_options(redis_server: RedisServer, tmp_path: Path) -> Callable[..., dict[str, str]]:
    """config_options(**extra) writes a config.js naming the test Redis; returns the options."""
    counter = iter(range(1000))

    def make(**extra: Any) -> dict[str, str]:
        path = write_config(tmp_path / f"spark{next(counter)}.js", redis_server.url, **extra)
        return {"config": str(path)}

    return make
