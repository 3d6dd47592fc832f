"""Rows to changes: the Arrow record batches of a DataFrame in, changes encoded for the commit
script out, one row at a time.

Pure code, run on the executors. The columns are those `SinkOptions` checked on the driver; each
column of a record batch is turned into Python values once (Arrow's `to_pylist`), and each row
straight into the commit script's arguments (`Encoded`: the state as JSON bytes), without a
`Change` in between. What only the data can get wrong (a null or too long id, an unknown op, a
put's state that is not a JSON object, an unknown sub-resource) raises `ChangeError` naming the
row's id when that row is reached, so the chunks before it are committed first.

Map columns become JSON objects, as Spark's `to_json` writes them (Arrow gives maps as lists of
key-value pairs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from operator import itemgetter
from typing import Any

import orjson
import pyarrow as pa

from changefeed.errors import ChangeError
from publisher.bucket import MAX_ID_BYTES, Change, Encoded, object_state, state_refused
from publisher.spark.options import OPS, SinkOptions

Check = Callable[[Change], None]
"""Raises ChangeError when a change does not fit the bucket's resources (the bucket's
`validate`)."""


class RowEncoder:
    """Encodes the rows of one task, checking each row's sub-resources once per distinct list."""

    def __init__(self, options: SinkOptions, check: Check) -> None:
        self.options = options
        self.check = check
        self._subs: dict[tuple[str, ...], bytes] = {}
        if options.sub_resources is not None:
            self._constant_subs = self._subs_json("", options.sub_resources)

    def encode(self, batch: pa.RecordBatch) -> Iterator[Encoded]:
        """The changes the rows of `batch` stand for, in row order."""
        options = self.options
        count = batch.num_rows
        ids = _column(batch, options.id_column)
        subs: Iterable[Any] = (
            _column(batch, options.sub_resources_column)
            if options.sub_resources_column
            else [None] * count
        )
        ops: Iterable[Any] = (
            _column(batch, options.op_column) if options.op_column else [options.default_op] * count
        )
        states: Iterable[Any]
        if options.state == "row":
            states = _rows(batch, options.state_columns)
        elif options.state == "column":
            states = _column(batch, options.state_column)
        else:
            states = [None] * count
        resource = options.resource
        for raw_id, raw_subs, op, state in zip(ids, subs, ops, states, strict=True):
            id = self._id(raw_id)
            subs_json = (
                self._constant_subs if raw_subs is None and options.sub_resources is not None
                else self._subs_json(id, _sub_resources(raw_subs))
            )
            if op == "put":
                yield "put", resource, id, subs_json, self._state(id, state)
            elif op == "delete" or op == "publish":
                yield op, resource, id, subs_json, b""
            else:
                raise ChangeError(
                    f"row {id!r}: {options.op_column!r} is {op!r}, expected one of {', '.join(OPS)}"
                )

    def _id(self, raw: Any) -> str:
        if raw is None:
            raise ChangeError(
                f"a row of {self.options.resource!r} has a null {self.options.id_column!r}"
            )
        id = raw if isinstance(raw, str) else str(raw)
        if not id or (len(id) * 4 > MAX_ID_BYTES and len(id.encode()) > MAX_ID_BYTES):
            raise ChangeError(
                f"row {id!r}: {self.options.id_column!r} must be 1 to {MAX_ID_BYTES} bytes"
            )
        return id

    def _subs_json(self, id: str, subs: tuple[str, ...]) -> bytes:
        known = self._subs.get(subs)
        if known is None:
            try:
                self.check(Change.publish(self.options.resource, id or "-", subs))
            except ChangeError as exc:
                raise ChangeError(f"row {id!r}: {exc}") from None
            known = self._subs[subs] = orjson.dumps(list(subs))
        return known

    def _state(self, id: str, state: Any) -> bytes:
        if self.options.state == "row":
            return orjson.dumps(state)
        if self.options.state == "column":
            column = self.options.state_column
            if state is None:
                raise state_refused(self.options.resource, id, "null")
            try:
                encoded = orjson.dumps(orjson.loads(state))
            except orjson.JSONDecodeError as exc:
                raise ChangeError(f"row {id!r}: {column!r} is not JSON ({exc})") from None
            return object_state(self.options.resource, id, encoded)
        raise state_refused(self.options.resource, id, "null")


def chunks(changes: Iterable[Encoded], size: int) -> Iterator[list[Encoded]]:
    """The changes grouped into lists of `size` (the last may be shorter), in order."""
    pending: list[Encoded] = []
    for change in changes:
        pending.append(change)
        if len(pending) == size:
            yield pending
            pending = []
    if pending:
        yield pending


def by_id(chunk: list[Encoded]) -> list[Encoded]:
    """`chunk` in a canonical order: by id, stably (one id's changes keep their order)."""
    return sorted(chunk, key=_ID)


_ID = itemgetter(2)


def canonical(changes: Iterable[Encoded]) -> list[Encoded]:
    """All of `changes` in an order that does not depend on theirs: by id, then by content
    (one id's changes are then ordered by their content, not as they came)."""
    return sorted(changes, key=_CANONICAL)


_CANONICAL = itemgetter(2, 4, 0, 3)


def _rows(batch: pa.RecordBatch, names: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    """Each row as a dict of the columns `names` (maps as dicts)."""
    columns = [_column(batch, name) for name in names]
    for values in zip(*columns, strict=True):
        yield dict(zip(names, values, strict=True))


def _column(batch: pa.RecordBatch, name: str | None) -> list[Any]:
    assert name is not None
    array = batch.column(batch.schema.get_field_index(name))
    values: list[Any] = array.to_pylist()
    convert = _converter(array.type)
    return values if convert is None else [convert(value) for value in values]


def _converter(kind: pa.DataType) -> Callable[[Any], Any] | None:
    """What turns the Python values of an Arrow type into JSON-able ones: maps become dicts
    (recursively); None when nothing needs it."""
    if pa.types.is_map(kind):
        key = _converter(kind.key_type) or _same
        item = _converter(kind.item_type) or _same
        return lambda pairs: None if pairs is None else {
            _key(key(k)): item(v) for k, v in pairs
        }
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        element = _converter(kind.value_type)
        if element is None:
            return None
        return lambda values: None if values is None else [element(v) for v in values]
    if pa.types.is_struct(kind):
        members = [kind.field(i) for i in range(kind.num_fields)]
        fields = {member.name: _converter(member.type) for member in members}
        convert = {name: f for name, f in fields.items() if f is not None}
        if not convert:
            return None
        return lambda value: None if value is None else {
            name: convert[name](v) if name in convert else v for name, v in value.items()
        }
    return None


def _same(value: Any) -> Any:
    return value


def _key(value: Any) -> Any:
    """A map's key as JSON object keys must be: strings (numbers and booleans as to_json
    writes them)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _sub_resources(value: list[str] | str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(name.strip() for name in value.split(",") if name.strip())
    return tuple(name for name in value if name)


__all__ = ["Check", "RowEncoder", "by_id", "canonical", "chunks"]

