"""Dataset diffs: exact counts, sub-resources and stored states."""

from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest
import redis
from pyspark.sql import SparkSession

from publisher.spark import CREATED, DELETED, DiffCounts, OptionError, publish_dataset_changes
from tests.publisher.spark.test_sink import log_of
from tests.servers import RedisServer

SCHEMA = "key long, name string, size int, owner string"
DATASET = {
    "resource": "dataset",
    "subResources": ["name", "size", "owner", CREATED, DELETED],
    "bootstrapRoute": "/datasets",
}
BEFORE = [(1, "a", 10, "x"), (2, "b", 20, "y"), (3, "c", 30, "z"), (4, "d", None, "w"),
          (6, "f", 60, "u")]
AFTER = [(1, "a", 10, "x"), (2, "b", 25, "y"), (3, "C", 30, "q"), (4, "d", 40, "w"),
         (5, "e", 50, "v")]


def test_counts_sub_resources_and_store_are_exact(
    spark: SparkSession, redis_server: RedisServer, config_options: Callable[..., dict[str, str]]
) -> None:
    options = config_options(resources=[DATASET])
    before = spark.createDataFrame(BEFORE, SCHEMA)
    after = spark.createDataFrame(AFTER, SCHEMA)
    empty = spark.createDataFrame([], SCHEMA)

    assert publish_dataset_changes(empty, before, key="key", resource="dataset", **options) == (
        DiffCounts(created=5, updated=0, deleted=0)
    )
    counts = publish_dataset_changes(before, after, key="key", resource="dataset", **options)
    assert counts == DiffCounts(created=1, updated=3, deleted=1)
    assert counts.published == 5

    second_run = log_of(redis_server.url)[5:]
    assert sorted((id, subs) for _, subs, id in second_run) == [
        ("2", ["size"]),
        ("3", ["name", "owner"]),
        ("4", ["size"]),
        ("5", [CREATED, "name", "size", "owner"]),
        ("6", [DELETED, "name", "size", "owner"]),
    ]
    stored: dict[bytes, bytes] = redis.Redis.from_url(redis_server.url).hgetall(  # type: ignore[assignment]
        "{test}:state:dataset"
    )
    assert {id.decode(): orjson.loads(state) for id, state in stored.items()} == {
        str(key): {"key": key, "name": name, "size": size, "owner": owner}
        for key, name, size, owner in AFTER
    }


def test_columns_must_be_sub_resources_of_the_resource(
    spark: SparkSession, redis_server: RedisServer, config_options: Callable[..., dict[str, str]]
) -> None:
    options = config_options()  # vm: nic, alias, state
    rows = spark.createDataFrame(AFTER, SCHEMA)
    with pytest.raises(OptionError, match="include name, size, owner, created, deleted"):
        publish_dataset_changes(rows, rows, key="key", resource="vm", **options)
    with pytest.raises(OptionError, match="option 'key': got 'uuid', expected a column of before"):
        publish_dataset_changes(rows, rows, key="uuid", resource="vm", **options)
    with pytest.raises(OptionError, match="differing: \\['size'\\]"):
        publish_dataset_changes(rows, rows.drop("size"), key="key", resource="vm", **options)
    assert log_of(redis_server.url) == []
