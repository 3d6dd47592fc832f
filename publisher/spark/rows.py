"""Rows to changes: one Arrow record batch of a DataFrame in, the publisher's `Change`s out.

Pure code, run on the executors. The columns are those `SinkOptions` checked on the driver;
what only the data can get wrong (a null id, an unknown op, a state that is not JSON) raises
`ChangeError` naming the row's id.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson
import pyarrow as pa

from changefeed.errors import ChangeError
from publisher.bucket import Change, Op
from publisher.spark.options import OPS, SinkOptions


def changes_of(batch: pa.RecordBatch, options: SinkOptions) -> list[Change]:
    """The changes the rows of `batch` stand for, in row order."""
    ids = _column(batch, options.id_column)
    subs = (
        [options.sub_resources] * batch.num_rows
        if options.sub_resources is not None
        else [_sub_resources(value) for value in _column(batch, options.sub_resources_column)]
    )
    ops = (
        _column(batch, options.op_column)
        if options.op_column
        else [options.default_op] * batch.num_rows
    )
    states: list[Any]
    if options.state == "row":
        states = batch.select(list(options.state_columns)).to_pylist()
    elif options.state == "column":
        states = _column(batch, options.state_column)
    else:
        states = [None] * batch.num_rows

    changes = []
    for raw_id, sub_resources, op, state in zip(ids, subs, ops, states, strict=True):
        if raw_id is None:
            raise ChangeError(f"a row of {options.resource!r} has a null {options.id_column!r}")
        id = str(raw_id)
        changes.append(_change(options, id, sub_resources, op, state))
    return changes


def chunks(changes: Iterable[list[Change]], size: int) -> Iterator[list[Change]]:
    """The changes regrouped into lists of `size` (the last may be shorter), in order."""
    pending: list[Change] = []
    for group in changes:
        pending += group
        while len(pending) >= size:
            yield pending[:size]
            pending = pending[size:]
    if pending:
        yield pending


def _change(
    options: SinkOptions, id: str, sub_resources: tuple[str, ...], op: Op | None, state: Any
) -> Change:
    if op == "put":
        if options.state == "column":
            state = _json(options, id, state)
        return Change.put(options.resource, id, sub_resources, state)
    if op == "delete":
        return Change.delete(options.resource, id, sub_resources)
    if op == "publish":
        return Change.publish(options.resource, id, sub_resources)
    raise ChangeError(
        f"row {id!r}: {options.op_column!r} is {op!r}, expected one of {', '.join(OPS)}"
    )


def _json(options: SinkOptions, id: str, text: str | None) -> Any:
    if text is None:
        raise ChangeError(f"row {id!r}: {options.state_column!r} is null (a put needs a state)")
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ChangeError(f"row {id!r}: {options.state_column!r} is not JSON ({exc})") from None


def _column(batch: pa.RecordBatch, name: str | None) -> list[Any]:
    assert name is not None
    values: list[Any] = batch.column(batch.schema.get_field_index(name)).to_pylist()
    return values


def _sub_resources(value: list[str] | str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(name.strip() for name in value.split(",") if name.strip())
    return tuple(name for name in value if name)
