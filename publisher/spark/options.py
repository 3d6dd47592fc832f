"""The options of the `changefeed` data source, checked once on the driver.

Pure code: option maps and Spark schemas in, frozen dataclasses out (reading config.js aside).
Every error is an `OptionError` naming the option, the value and what was expected, raised before
any task starts, so a job with a bad option writes nothing. docs/spark.md lists every option.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DecimalType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from changefeed.cursor import Cursor
from changefeed.errors import CursorError, OptionError
from changefeed.protocol import Resource
from publisher.bucket import BATCH, Op
from publisher.config import load_config
from publisher.embedded import EmbeddedRedis

PIPELINE = 4
"""Lua calls (of `batchSize` changes each) sent per round trip by an executor."""

OPS: tuple[Op, ...] = ("put", "delete", "publish")
ID_TYPES = (StringType, LongType, IntegerType, ShortType)
StateSource = Literal["none", "row", "column"]




@dataclass(frozen=True, slots=True)
class Target:
    """The bucket a job reads or writes: where its Redis is, its name, its resources."""

    redis_url: str
    name: str
    resources: tuple[Resource, ...] | None
    """None when the options name no config.js: resources and sub-resources are not checked."""
    partitions: int | None = None
    """The config's bucket.partitions (a new bucket is created with it); None: the bucket's."""

    def resource(self, name: str) -> Resource | None:
        return next((r for r in self.resources or () if r.resource == name), None)


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """How the rows of a DataFrame become changes."""

    target: Target
    resource: str
    id_column: str
    sub_resources: tuple[str, ...] | None
    """The same sub-resources for every row, or None to read them from `sub_resources_column`."""
    sub_resources_column: str | None
    state: StateSource
    state_column: str | None
    state_columns: tuple[str, ...]
    """With state "row": the columns making up the stored object (the id's among them)."""
    op_column: str | None
    default_op: Op
    batch_size: int
    pipeline: int
    query: str | None
    """The streaming query's name: the key of its record of committed micro-batches."""


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Where a read of the change log starts and how it is split."""

    target: Target
    start: str
    """"earliest", "latest" or a cursor (exclusive)."""
    partitions: int
    max_items_per_trigger: int | None
    fail_on_data_loss: bool


class Options:
    """Case-insensitive view of the options Spark passes (it lower-cases their names)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._values = {key.lower(): value for key, value in options.items()}

    def get(self, key: str) -> str | None:
        return self._values.get(key.lower())

    def integer(self, key: str, default: int) -> int:
        value = self.get(key)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number <= 0:
            raise OptionError(key, value, "a positive integer")
        return number

    def boolean(self, key: str, default: bool) -> bool:
        value = self.get(key)
        if value is None:
            return default
        if value.lower() not in ("true", "false"):
            raise OptionError(key, value, "true or false")
        return value.lower() == "true"


def target_of(options: Mapping[str, str]) -> Target:
    """The bucket named by `config` (a config.js) or by `redisUrl` and `bucket`."""
    opts = Options(options)
    path, url, name = opts.get("config"), opts.get("redisUrl"), opts.get("bucket")
    if path is None:
        if url is None or name is None:
            raise OptionError(
                "config", None, "the path of a config.js, or both options redisUrl and bucket"
            )
        return Target(url, name, None)
    config = load_config(path)
    redis_url = url or config.bucket.redis_url or EmbeddedRedis(config.state_dir).url
    return Target(
        redis_url, name or config.bucket.name, config.resources, config.bucket.partitions
    )


def sink_options(options: Mapping[str, str], schema: StructType, streaming: bool) -> SinkOptions:
    """Check the write options against the DataFrame's schema."""
    opts = Options(options)
    target = target_of(options)
    columns = {field.name: field.dataType for field in schema.fields}

    def column(
        key: str, default: str | None, kinds: tuple[type[DataType], ...], what: str
    ) -> str | None:
        name = opts.get(key) or default
        if name is None:
            return None
        if name not in columns:
            raise OptionError(key, name, f"a column of the DataFrame ({', '.join(columns)})")
        if not isinstance(columns[name], kinds):
            raise OptionError(key, name, f"a column of {what}, not {columns[name].simpleString()}")
        return name

    resource = opts.get("resource")
    if not resource:
        raise OptionError("resource", resource, "the name of the resource the rows are changes of")
    configured = target.resource(resource)
    if target.resources is not None and configured is None:
        known = ", ".join(r.resource for r in target.resources)
        raise OptionError("resource", resource, f"a resource of the config ({known})")

    id_column = column("idColumn", "id", ID_TYPES, "strings or integers")
    assert id_column is not None

    listed, subs_column = opts.get("subResources"), opts.get("subResourcesColumn")
    if (listed is None) == (subs_column is None):
        raise OptionError(
            "subResources", listed, "either subResources (names) or subResourcesColumn, not both"
        )
    sub_resources = None
    if listed is not None:
        sub_resources = tuple(name.strip() for name in listed.split(",") if name.strip())
        if not sub_resources:
            raise OptionError("subResources", listed, "comma-separated sub-resource names")
        unknown = [s for s in sub_resources if configured and s not in configured.sub_resources]
        if unknown:
            known = ", ".join(configured.sub_resources) if configured else ""
            raise OptionError("subResources", listed, f"sub-resources of {resource!r} ({known})")
    subs_column = column(
        "subResourcesColumn", None, (ArrayType, StringType), "arrays of strings or strings"
    )
    state_column = column("stateColumn", None, (StringType,), "JSON strings")
    op_column = column("opColumn", None, (StringType,), "strings: put, delete or publish")

    state = opts.get("state") or ("column" if state_column else "none")
    if state not in ("none", "row", "column") or (state == "column") != bool(state_column):
        raise OptionError(
            "state", state, "none, row, or column (with stateColumn naming a JSON column)"
        )
    control = {subs_column, op_column} - {None}
    state_columns = tuple(name for name in columns if name not in control)
    if state == "row":
        for name in state_columns:
            _check_json_type(name, columns[name])

    query = None
    if streaming:
        query = opts.get("queryName") or _digest(opts.get("checkpointLocation"))
        if query is None:
            raise OptionError(
                "queryName", None, "a query name or checkpointLocation (the key of the record "
                "of committed micro-batches that makes retries publish nothing twice)"
            )
    return SinkOptions(
        target=target,
        resource=resource,
        id_column=id_column,
        sub_resources=sub_resources,
        sub_resources_column=subs_column,
        state=state,  # type: ignore[arg-type]  # checked above
        state_column=state_column,
        state_columns=state_columns,
        op_column=op_column,
        default_op="publish" if state == "none" else "put",
        batch_size=opts.integer("batchSize", BATCH),
        pipeline=opts.integer("pipeline", PIPELINE),
        query=query,
    )


def source_options(options: Mapping[str, str]) -> SourceOptions:
    opts = Options(options)
    start = opts.get("startingCursor") or "earliest"
    if start not in ("earliest", "latest"):
        try:
            Cursor.decode(start)
        except CursorError:
            raise OptionError("startingCursor", start, "earliest, latest or a cursor") from None
    limit = opts.get("maxItemsPerTrigger")
    return SourceOptions(
        target=target_of(options),
        start=start,
        partitions=opts.integer("numPartitions", 1),
        max_items_per_trigger=None if limit is None else opts.integer("maxItemsPerTrigger", 1),
        fail_on_data_loss=opts.boolean("failOnDataLoss", True),
    )


def _check_json_type(name: str, kind: DataType) -> None:
    if isinstance(kind, DecimalType | BinaryType):
        raise OptionError(
            "state", "row", f"columns that convert to JSON: cast {name!r} "
            f"({kind.simpleString()}) to double or string first"
        )
    if isinstance(kind, ArrayType):
        _check_json_type(name, kind.elementType)
    elif isinstance(kind, MapType):
        _check_json_type(name, kind.valueType)
    elif isinstance(kind, StructType):
        for field in kind.fields:
            _check_json_type(f"{name}.{field.name}", field.dataType)


def _digest(text: str | None) -> str | None:
    return None if text is None else "checkpoint-" + hashlib.sha256(text.encode()).hexdigest()[:16]
