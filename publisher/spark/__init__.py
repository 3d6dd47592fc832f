"""Spark jobs as publishers and listeners of the change feed (PySpark 4's Python Data Source API).

    from publisher.spark import publish_dataset_changes, register

    register(spark)                     # format("changefeed") for read, write and streams
    counts = publish_dataset_changes(before, after, key="id", resource="vm", config="config.js")
    committed_batches(query, config="config.js")   # a stream's micro-batches, with their figures

docs/spark.md describes the options, the dataset diff and how the package reaches executors.
"""

from changefeed.errors import OptionError
from publisher.spark.datasource import ChangefeedDataSource, register
from publisher.spark.diff import CREATED, DELETED, DiffCounts, publish_dataset_changes
from publisher.spark.progress import CommittedBatch, Figures, committed_batches

__all__ = [
    "CREATED",
    "DELETED",
    "ChangefeedDataSource",
    "CommittedBatch",
    "DiffCounts",
    "Figures",
    "OptionError",
    "committed_batches",
    "publish_dataset_changes",
    "register",
]
