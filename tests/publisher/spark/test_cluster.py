"""Spark on a cluster: a standalone master and worker on loopback run a job submitted with
`spark-submit --py-files`, whose executors publish through `format("changefeed")` into a bucket;
a listener on a real publisher hears each row once.

The bucket is in the session's 3-master Redis Cluster, spread over its masters in eight
partitions. Its URL is one fixture, `bucket_url`: the same test runs against any bucket the data
source and the publisher can reach by URL.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from changefeed.cursor import StreamId
from changefeed_testing.running import RunningPublisher
from listener import BootstrapDone, Change, Listener
from tests.publisher.spark.standalone import (
    StandaloneCluster,
    package_zip,
    python_without_project,
)
from tests.servers import RedisCluster, scaled

ROWS = 100_000
JOB = Path(__file__).with_name("cluster_job.py")

SUBMIT_CONF = {
    "spark.driver.memory": "512m",
    "spark.executor.memory": "512m",
    "spark.executor.cores": "2",
    "spark.ui.enabled": "false",
    "spark.task.maxFailures": "2",
    # Short-lived JVMs doing little Java work: the quick compiler only, the serial collector.
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}
"""The job's settings: one executor of two cores on the worker, small heaps."""


BUCKET = "sparkjob"
"""A bucket name no other test of the session uses in the shared cluster."""
PARTITIONS = 8
"""The bucket's partitions: spread over the Redis Cluster's three masters."""


@pytest.fixture
def bucket_url(redis_cluster: RedisCluster) -> str:
    """The Redis URL of the bucket the job writes and the publisher serves: the session's
    3-master Redis Cluster (`redis+cluster://`), as executors on other machines would reach it.
    The test's one parameter: override this fixture to run the same job against another bucket
    (a single redis-server's `redis://` URL works the same)."""
    return redis_cluster.url


async def logged_ids(publisher: RunningPublisher) -> Counter[str]:
    """The changed ids of every item in the bucket's log, as the bucket reads it."""
    ids: Counter[str] = Counter()
    async with publisher.bucket() as bucket:
        for log in await bucket.log.shards():  # each shard has positions of its own
            after = StreamId(0, 0)
            while entries := await log.read(after, count=10_000):
                ids.update(entry.changed_resource_id for entry in entries)
                after = entries[-1].position
    return ids


@pytest.mark.timeout(300)
async def test_a_job_on_a_standalone_cluster_publishes_each_row_once(
    bucket_url: str, tmp_path: Path
) -> None:
    python = python_without_project(tmp_path / "executor-env")
    shipped = package_zip(tmp_path / "changefeed.zip")

    cluster = StandaloneCluster(tmp_path / "spark")
    heard: Counter[str] = Counter()
    events: Counter[str] = Counter()
    ready = asyncio.Event()

    async def listen(feed: Listener) -> None:
        """Count the feed's events until ROWS changes came."""
        async for event in feed:
            events[type(event).__name__] += 1
            if isinstance(event, BootstrapDone):
                ready.set()
            elif isinstance(event, Change):
                heard[event.id] += 1
                if events["ChangeEvent"] == ROWS:
                    return

    starting = asyncio.create_task(asyncio.to_thread(cluster.start))  # while the rest starts
    publisher: RunningPublisher | None = None
    try:
        publisher = RunningPublisher.start(tmp_path / "publisher", bucket_url, {
            "bucket": {"name": BUCKET, "partitions": PARTITIONS}})
        async with Listener(publisher.url, instance="spark-cluster", service="test",
                            resources={"vm": ["nic"]}) as feed:
            listening = asyncio.create_task(listen(feed))
            async with asyncio.timeout(scaled(30)):
                await asyncio.wait([listening, asyncio.create_task(ready.wait())],
                                   return_when=asyncio.FIRST_COMPLETED)
            assert ready.is_set(), listening.result()
            # In threads: the listener goes on reading (and answering pings) meanwhile.
            await starting
            job = await asyncio.to_thread(
                cluster.submit, JOB, [bucket_url, BUCKET, str(ROWS), "2"],
                py_files=[shipped], python=python, conf=SUBMIT_CONF, seconds=180,
            )
            (tmp_path / "job.log").write_text(job.stdout)  # kept for a failure's post-mortem
            assert job.returncode == 0, job.stdout
            assert f"published {ROWS} on {cluster.url}" in job.stdout
            try:
                async with asyncio.timeout(scaled(60)):
                    await listening
            except TimeoutError:
                pytest.fail(f"the listener heard {events} of {ROWS} changes")
        # Every row heard exactly once, as a live change (no resync, no second bootstrap),
        # and in the log once.
        expected = Counter({f"vm-{n}": 1 for n in range(ROWS)})
        assert heard == expected
        assert events["Resync"] == 0 and events["BootstrapDone"] == 1
        assert await logged_ids(publisher) == expected
    finally:
        if publisher is not None:
            publisher.stop()
        await asyncio.gather(starting, return_exceptions=True)
        cluster.stop()
