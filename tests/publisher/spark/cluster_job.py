"""A Spark application that publishes `rows` changes through `format("changefeed")`, run by
tests/publisher/spark/test_cluster.py:
`spark-submit ... cluster_job.py <redis url> <bucket> <rows> <tasks>`.

Change n is of `vm` `vm-<n>`, sub-resource `nic`, its row stored as the state. The job prints
`published <rows> on <master>` once the write has committed.
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession

from publisher.spark import register


def main(redis_url: str, bucket: str, rows: int, partitions: int) -> None:
    spark = SparkSession.builder.appName("changefeed-cluster-test").getOrCreate()
    register(spark)  # the package came by --py-files: Spark's lookup of pyspark_* misses it
    vms = spark.range(0, rows, numPartitions=partitions).selectExpr(
        "concat('vm-', id) as id", "id * 1024 as ram"
    )
    (vms.write.format("changefeed").mode("append")
        .option("redisUrl", redis_url).option("bucket", bucket)
        .option("resource", "vm").option("subResources", "nic").option("state", "row")
        .save())
    print(f"published {rows} on {spark.sparkContext.master}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
