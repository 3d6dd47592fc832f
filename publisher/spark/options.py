"""The options of the `changefeed` data source, checked once on the driver.

Pure code: option maps and Spark schemas in, frozen dataclasses out (reading config.js aside).
Every error is an `OptionError` naming the option, the value and what was expected, raised before
any task starts, so a job with a bad option writes nothing. docs/spark.md lists every option.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal
from urllib.parse import urlsplit

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

from changefeed import configjs as cj
from changefeed.cursor import Position
from changefeed.errors import ConfigError, CursorError, OptionError
from changefeed.protocol import Resource
from publisher.bucket import BATCH, REPLICAS_TIMEOUT, Op
from publisher.bucket.redis.embedded import EmbeddedRedis
from publisher.bucket.redis.sentinel import SCHEME
from publisher.bucket.redis.sentinel import redis_url as any_redis_url
from publisher.config.settings import load_config

PIPELINE = 4
"""Lua calls (of `batchSize` changes each) sent per round trip by an executor."""

OPS: tuple[Op, ...] = ("put", "delete", "publish")
ID_TYPES = (StringType, LongType, IntegerType, ShortType)
StateSource = Literal["none", "row", "column"]
Table = Literal["changes", "store"]
RECORD_RETENTION = 7 * 24 * 3600
"""Seconds a txn record (and a streaming query's ledger) is kept after its last write."""

_COMMON = ("config", "redisUrl", "bucket")
SINK_OPTIONS = (
    *_COMMON, "resource", "idColumn", "subResources", "subResourcesColumn", "state",
    "stateColumn", "opColumn", "batchSize", "pipeline", "sortRows", "txnAppId", "txnVersion",
    "recordRetention", "queryName", "checkpointLocation", "replicas", "replicasTimeout",
)
SOURCE_OPTIONS = (
    *_COMMON, "table", "resource", "startingCursor", "endingCursor", "startingTimestamp",
    "endingTimestamp", "includeState", "numPartitions", "maxItemsPerTrigger", "failOnDataLoss",
)
_SPARK_OPTIONS = ("path", "checkpointLocation", "queryName")
"""Options Spark itself may pass (with any starting "__", its internal ones)."""


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
    txn_app_id: str | None = None
    """A batch job's txnAppId: with `txn_version`, a version already committed is skipped."""
    txn_version: int | None = None
    record_retention: int = RECORD_RETENTION
    """Seconds the txn record (or the streaming ledger) is kept after the last write."""
    sort_rows: bool = False
    """Sort each task's changes (by id, then content) before cutting them into chunks, so a
    retry that gets the same rows in another order (after a shuffle) makes the same chunks."""
    replicas: int = 0
    """Each task waits until this many replicas have its changes (Redis WAIT), else fails."""
    replicas_timeout: float = REPLICAS_TIMEOUT


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """What a read takes (the change log, or the store) and, of the log, which range."""

    target: Target
    start: str
    """"earliest", "latest" or a cursor (exclusive)."""
    partitions: int
    max_items_per_trigger: int | None
    fail_on_data_loss: bool
    end: str | None = None
    """A cursor (inclusive), "latest", or None: the head when the read is planned."""
    start_ms: int | None = None
    """startingTimestamp: the first change published at or after it (instead of `start`)."""
    end_ms: int | None = None
    """endingTimestamp: the last change published at or before it (instead of `end`)."""
    include_state: bool = False
    """Add each change's current stored state (a `state` column of JSON text)."""
    table: Table = "changes"
    resources: tuple[str, ...] | None = None
    """With table "store": the resources to read (None: every one with a stored state)."""


class Options:
    """Case-insensitive view of the options Spark passes (it lower-cases their names)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._values = {key.lower(): value for key, value in options.items()}

    def check_known(self, known: tuple[str, ...]) -> None:
        """OptionError for an option this data source does not know (a typo reads nothing)."""
        names = {name.lower(): name for name in (*known, *_SPARK_OPTIONS)}
        for key, value in self._values.items():
            if key not in names and not key.startswith("__"):
                raise OptionError(key, value, f"one of the options {', '.join(known)}")

    def non_negative(self, key: str) -> int | None:
        value = self.get(key)
        if value is None:
            return None
        if not value.isdigit():
            raise OptionError(key, value, "a non-negative integer")
        return int(value)

    def get(self, key: str) -> str | None:
        return self._values.get(key.lower())

    def integer(self, key: str, default: int) -> int:
        return int(self._positive(key, default, int, "a positive integer"))

    def seconds(self, key: str, default: float) -> float:
        return self._positive(key, default, float, "a positive number of seconds")

    def _positive(self, key: str, default: float, kind: type[int] | type[float],
                  expected: str) -> float:
        """The option `key` as a positive `kind` (`default` when absent); else OptionError."""
        value = self.get(key)
        if value is None:
            return default
        try:
            number: float = kind(value)
        except ValueError:
            number = 0
        if not 0 < number < float("inf"):
            raise OptionError(key, value, expected)
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
    if url is not None:
        _check_redis_url(url)
    if name is not None and not cj.NAME.match(name):
        raise OptionError("bucket", name, "a bucket name of letters, digits, '_', '.' or '-'")
    if path is None:
        if url is None or name is None:
            raise OptionError(
                "config", None, "the path of a config.js, or both options redisUrl and bucket"
            )
        return Target(url, name, None)
    try:
        config = load_config(path)
    except OSError as exc:
        raise OptionError("config", path, f"the path of a readable config.js ({exc})") from None
    redis_url = url or config.bucket.redis_url or EmbeddedRedis(config.state_dir).url
    return Target(
        redis_url, name or config.bucket.name, config.resources, config.bucket.partitions
    )


def sink_options(options: Mapping[str, str], schema: StructType, streaming: bool) -> SinkOptions:
    """Check the write options against the DataFrame's schema."""
    opts = Options(options)
    opts.check_known(SINK_OPTIONS)
    target = target_of(options)
    columns = {field.name: field.dataType for field in schema.fields}
    resource, configured = _resource(opts, target)
    id_column = _column(opts, columns, "idColumn", "id", ID_TYPES, "strings or integers")
    assert id_column is not None
    sub_resources, subs_column = _sub_resources(opts, columns, resource, configured)
    state_column = _column(opts, columns, "stateColumn", None, (StringType,), "JSON strings")
    op_column = _column(
        opts, columns, "opColumn", None, (StringType,), "strings: put, delete or publish"
    )
    control = {name for name in (subs_column, op_column) if name is not None}
    state, state_columns = _state(opts, columns, state_column, control)
    query = _query(opts) if streaming else None
    app_id, version = _txn(opts, streaming)
    return SinkOptions(
        target=target,
        resource=resource,
        id_column=id_column,
        sub_resources=sub_resources,
        sub_resources_column=subs_column,
        state=state,
        state_column=state_column,
        state_columns=state_columns,
        op_column=op_column,
        default_op="publish" if state == "none" else "put",
        batch_size=opts.integer("batchSize", BATCH),
        pipeline=opts.integer("pipeline", PIPELINE),
        query=query,
        txn_app_id=app_id,
        txn_version=version,
        record_retention=opts.integer("recordRetention", RECORD_RETENTION),
        sort_rows=opts.boolean("sortRows", False),
        replicas=opts.integer("replicas", 0),
        replicas_timeout=opts.seconds("replicasTimeout", REPLICAS_TIMEOUT),
    )


def _column(
    opts: Options, columns: Mapping[str, DataType], key: str, default: str | None,
    kinds: tuple[type[DataType], ...], what: str,
) -> str | None:
    """The column option `key` names (or `default`), checked to be of one of `kinds`."""
    name = opts.get(key) or default
    if name is None:
        return None
    if name not in columns:
        raise OptionError(key, name, f"a column of the DataFrame ({', '.join(columns)})")
    if not isinstance(columns[name], kinds):
        raise OptionError(key, name, f"a column of {what}, not {columns[name].simpleString()}")
    return name


def _resource(opts: Options, target: Target) -> tuple[str, Resource | None]:
    """The resource the rows are changes of, with its definition in the config (if any)."""
    resource = opts.get("resource")
    if not resource:
        raise OptionError("resource", resource, "the name of the resource the rows are changes of")
    configured = target.resource(resource)
    if target.resources is not None and configured is None:
        known = ", ".join(r.resource for r in target.resources)
        raise OptionError("resource", resource, f"a resource of the config ({known})")
    return resource, configured


def _sub_resources(
    opts: Options, columns: Mapping[str, DataType], resource: str, configured: Resource | None
) -> tuple[tuple[str, ...] | None, str | None]:
    """The sub-resources of every row (`subResources`), or the column that names each row's
    (`subResourcesColumn`): exactly one of them."""
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
    subs_column = _column(
        opts, columns, "subResourcesColumn", None, (ArrayType, StringType),
        "arrays of strings or strings",
    )
    return sub_resources, subs_column


def _state(
    opts: Options, columns: Mapping[str, DataType], state_column: str | None, control: set[str]
) -> tuple[StateSource, tuple[str, ...]]:
    """Where a row's state comes from (none, the row, a JSON column) and, from the row, its
    columns: all but the `control` columns (sub-resources, op)."""
    state = opts.get("state") or ("column" if state_column else "none")
    if state not in ("none", "row", "column") or (state == "column") != bool(state_column):
        raise OptionError(
            "state", state, "none, row, or column (with stateColumn naming a JSON column)"
        )
    state_columns = tuple(name for name in columns if name not in control)
    if state == "row":
        for name in state_columns:
            _check_json_type(name, columns[name])
    return state, state_columns  # type: ignore[return-value]  # checked above


def _query(opts: Options) -> str:
    """A streaming write's query name: the key of its record of committed micro-batches."""
    query = opts.get("queryName") or _digest(opts.get("checkpointLocation"))
    if query is None:
        raise OptionError(
            "queryName", None, "a query name or checkpointLocation (the key of the record "
            "of committed micro-batches that makes retries publish nothing twice)"
        )
    return query


def _txn(opts: Options, streaming: bool) -> tuple[str | None, int | None]:
    """A batch write's txnAppId and txnVersion (both or neither; never when streaming)."""
    app_id, version = opts.get("txnAppId"), opts.non_negative("txnVersion")
    if (app_id is None) != (version is None):
        raise OptionError(
            "txnAppId" if app_id is None else "txnVersion", None,
            "txnAppId and txnVersion together (a job's name and the version it writes)",
        )
    if app_id is not None and not cj.NAME.match(app_id):
        raise OptionError("txnAppId", app_id, "a name of letters, digits, '_', '.' or '-'")
    if app_id is not None and streaming:
        raise OptionError(
            "txnAppId", app_id, "no txnAppId on a streaming write (its micro-batches are "
            "recorded under the query's name); use it in foreachBatch or batch writes",
        )
    return app_id, version


def source_options(options: Mapping[str, str], streaming: bool = False) -> SourceOptions:
    """Check the read options (of a batch read, or of a stream when `streaming`)."""
    opts = Options(options)
    opts.check_known(SOURCE_OPTIONS)
    target = target_of(options)
    table = opts.get("table") or "changes"
    if table not in ("changes", "store") or (table == "store" and streaming):
        raise OptionError(
            "table", table, "changes (the log) or store (the stored states, batch reads only)"
        )
    if table == "store":
        for key in ("startingCursor", "endingCursor", "startingTimestamp", "endingTimestamp",
                    "includeState", "maxItemsPerTrigger"):
            if opts.get(key) is not None:
                raise OptionError(key, opts.get(key), "no range of the log with table=store")
        listed = opts.get("resource")
        resources = None
        if listed is not None:
            resources = tuple(name.strip() for name in listed.split(",") if name.strip())
            unknown = [r for r in resources if target.resources and not target.resource(r)]
            if not resources or unknown:
                known = ", ".join(r.resource for r in target.resources or ())
                raise OptionError("resource", listed, f"resources of the config ({known})")
        return SourceOptions(target, "earliest", opts.integer("numPartitions", 1), None, True,
                             table="store", resources=resources)
    if opts.get("resource") is not None:
        raise OptionError("resource", opts.get("resource"), "no resource when reading the "
                          "log (filter on the resource column), or table=store")

    start = _exclusive("startingCursor", "startingTimestamp", opts) or "earliest"
    if start not in ("earliest", "latest"):
        _cursor("startingCursor", start, "earliest, latest or a cursor")
    end = _exclusive("endingCursor", "endingTimestamp", opts, None)
    if end not in (None, "latest"):
        _cursor("endingCursor", end, "latest or a cursor (inclusive)")
    limit = opts.get("maxItemsPerTrigger")
    return SourceOptions(
        target=target,
        start=start,
        partitions=opts.integer("numPartitions", 1),
        max_items_per_trigger=None if limit is None else opts.integer("maxItemsPerTrigger", 1),
        fail_on_data_loss=opts.boolean("failOnDataLoss", True),
        end=end,
        start_ms=_timestamp("startingTimestamp", opts.get("startingTimestamp")),
        end_ms=_timestamp("endingTimestamp", opts.get("endingTimestamp")),
        include_state=opts.boolean("includeState", False),
    )


def _exclusive(
    cursor_key: str, time_key: str, opts: Options, default: str | None = "earliest"
) -> str | None:
    cursor = opts.get(cursor_key)
    if cursor is not None and opts.get(time_key) is not None:
        raise OptionError(time_key, opts.get(time_key), f"either {cursor_key} or {time_key}")
    return cursor if cursor is not None else default


def _cursor(key: str, value: str, expected: str) -> None:
    try:
        Position.decode(value)  # either kind: the bucket's layout is checked when read
    except CursorError:
        raise OptionError(key, value, expected) from None


def _timestamp(key: str, value: str | None) -> int | None:
    """Milliseconds since the epoch of an ISO 8601 date or time (UTC unless it says)."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise OptionError(
            key, value, "an ISO 8601 date or time, e.g. 2026-11-20T08:00:00Z (UTC if no zone)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _check_redis_url(url: str) -> None:
    try:
        any_redis_url("redisUrl", url)
    except ConfigError as exc:
        raise OptionError("redisUrl", url, exc.expected) from None
    parts = urlsplit(url)
    database = parts.path.strip("/")
    if parts.scheme not in ("unix", SCHEME) and database and not database.isdigit():
        raise OptionError("redisUrl", url, "a redis:// URL whose path is a database number")


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
