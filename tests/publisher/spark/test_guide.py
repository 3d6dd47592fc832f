"""docs/guide.md's Spark path, run as written: the job publishes its rows as changes and stores
them. Its `config.js` is a config naming the test's Redis (by its whole path: the suite's
SparkSession started its Python workers in the checkout, where a job's own would start in the
job's directory)."""

from __future__ import annotations

from pathlib import Path

import orjson
from pyspark.sql import SparkSession

from publisher import ChangeBucket, connect, load_config
from tests.deploy.test_guide import snippet
from tests.publisher.spark.test_sink import log_of
from tests.servers import RedisServer, write_config


async def test_the_guides_spark_job_publishes_its_rows(
    spark: SparkSession, redis_server: RedisServer, tmp_path: Path,
) -> None:
    config_path = write_config(tmp_path / "config.js", redis_server.url)
    job = snippet("spark")
    assert job.count('"config.js"') == 1
    job = job.replace('"config.js"', repr(str(config_path)))
    assert "getOrCreate()" in job  # the job finds the suite's session, as a job finds its own
    exec(compile(job, "guide:spark", "exec"), {})
    assert sorted(log_of(redis_server.url)) == [
        ("vm", ["alias"], "4b5c"), ("vm", ["alias"], "9f2e"),
    ]
    config = load_config(config_path)
    bucket = ChangeBucket(connect(redis_server.url), config.bucket.name, config.resources)
    try:
        state = await bucket.get("vm", "4b5c")
    finally:
        await bucket.aclose()
    assert state is not None
    assert orjson.loads(state) == {"uuid": "4b5c", "alias": "web-1"}
