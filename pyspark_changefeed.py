"""Spark's static registration of the `changefeed` data source.

Spark (4.0 and later) imports every top-level module whose name starts with ``pyspark_`` that the
Python it starts can find, and registers its `DefaultSource` under the source's name, in every
session: with this package installed in the Python of PYSPARK_PYTHON, ``format("changefeed")``
works without calling `publisher.spark.register(spark)`. docs/spark.md says more.
"""

from publisher.spark.datasource import ChangefeedDataSource as DefaultSource

__all__ = ["DefaultSource"]
