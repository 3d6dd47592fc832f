"""Dataset diffs: two versions of a dataset in, one change per created, updated or deleted row out.

The sub-resources of a change are the names of the columns that changed. A created row also
carries the marker `CREATED` and a deleted row `DELETED`, each with every value column (all of
them went from nothing to something, or back), so that a listener of one column hears of rows
appearing and disappearing, and a listener of the marker hears only of those. The store gets the
new version of every created or updated row, and loses every deleted row.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from changefeed.errors import OptionError
from publisher.spark.datasource import register
from publisher.spark.options import target_of

CREATED = "created"
"""The sub-resource marking a row that is in the new version only."""
DELETED = "deleted"
"""The sub-resource marking a row that is in the old version only."""


@dataclass(frozen=True, slots=True)
class DiffCounts:
    """How many rows of the new version were created, updated and deleted (all published)."""

    created: int
    updated: int
    deleted: int

    @property
    def published(self) -> int:
        return self.created + self.updated + self.deleted


def publish_dataset_changes(
    before: DataFrame,
    after: DataFrame,
    *,
    key: str,
    resource: str,
    created: str = CREATED,
    deleted: str = DELETED,
    **options: str,
) -> DiffCounts:
    """Publish the rows that differ between `before` and `after` (matched by `key`).

    `options` are those of the changefeed data source that name the bucket (`config`, or
    `redisUrl` and `bucket`) and tune the write (`batchSize`, `pipeline`). Columns are compared
    with null-safe equality; both versions must have the same columns.
    """
    columns = _value_columns(before, after, key)
    if created in columns or deleted in columns or created == deleted:
        raise OptionError("created", [created, deleted], "two markers that are not column names")
    target = target_of(options)
    configured = target.resource(resource)
    if target.resources is not None:
        if configured is None:
            known = ", ".join(r.resource for r in target.resources)
            raise OptionError("resource", resource, f"a resource of the config ({known})")
        missing = [s for s in (*columns, created, deleted) if s not in configured.sub_resources]
        if missing:
            raise OptionError(
                "resource", resource,
                f"a resource whose subResources include {', '.join(missing)} "
                "(every value column and both markers)",
            )

    diff = _diff(before, after, key, columns, created, deleted).persist()
    try:
        counts = {row["kind"]: row["count"] for row in diff.groupBy("kind").count().collect()}
        register(after.sparkSession)
        (
            diff.drop("kind")
            .write.format("changefeed")
            .mode("append")
            .options(**options)
            .option("resource", resource)
            .option("idColumn", "id")
            .option("subResourcesColumn", "subResources")
            .option("opColumn", "op")
            .option("stateColumn", "state")
            .save()
        )
    finally:
        diff.unpersist()
    return DiffCounts(counts.get(created, 0), counts.get("updated", 0), counts.get(deleted, 0))


def _value_columns(before: DataFrame, after: DataFrame, key: str) -> list[str]:
    for name, frame in (("before", before), ("after", after)):
        if key not in frame.columns:
            raise OptionError("key", key, f"a column of {name} ({', '.join(frame.columns)})")
    if set(before.columns) != set(after.columns):
        only = sorted(set(before.columns) ^ set(after.columns))
        raise OptionError("after", after.columns, f"the columns of before (differing: {only})")
    return [name for name in after.columns if name != key]


def _diff(
    before: DataFrame, after: DataFrame, key: str, columns: list[str], created: str, deleted: str
) -> DataFrame:
    """id, subResources, op, state (JSON of the new row) and kind, for each row that differs."""
    old, new = before.alias("old"), after.alias("new")
    every = [F.lit(name) for name in columns]
    changed = F.array_compact(
        F.array(*[F.when(~_col("old", c).eqNullSafe(_col("new", c)), F.lit(c)) for c in columns])
    )
    kind = (
        F.when(_col("old", key).isNull(), F.lit(created))
        .when(_col("new", key).isNull(), F.lit(deleted))
        .when(F.size(changed) > 0, F.lit("updated"))
    )
    subs = (
        F.when(_col("old", key).isNull(), F.array(F.lit(created), *every))
        .when(_col("new", key).isNull(), F.array(F.lit(deleted), *every))
        .otherwise(changed)
    )
    state = F.when(
        _col("new", key).isNotNull(),
        F.to_json(
            F.struct(*[_col("new", c) for c in after.columns]), {"ignoreNullFields": "false"}
        ),
    )
    return (
        old.join(new, _col("old", key) == _col("new", key), "full_outer")
        .select(
            F.coalesce(_col("new", key), _col("old", key)).cast("string").alias("id"),
            subs.alias("subResources"),
            F.when(_col("new", key).isNull(), F.lit("delete")).otherwise(F.lit("put")).alias("op"),
            state.alias("state"),
            kind.alias("kind"),
        )
        .where(F.col("kind").isNotNull())
    )


def _col(side: str, name: str) -> Column:
    return F.col(f"{side}.`{name}`")
