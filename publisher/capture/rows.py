"""Row changes of a transaction as the bucket's changes (pure): a column's text as a JSON value,
a table's relation checked against its mapping, and each insert, update or delete turned into a
put or delete of the resource, computed against the states the bucket holds.

What each row change announces (docs/capture.md):

- an insert: a put of the row's state, announcing every sub-resource of the resource;
- a delete: a delete announcing every sub-resource;
- an update: a put announcing the sub-resources whose columns (a Moray table: top-level keys of
  `_value`) differ from the stored state; one that changes only unmapped columns announces
  every sub-resource (the state changed, the mapping cannot say how); one that changes nothing
  of the state (`UPDATE t SET a = a`, a Moray write of its bookkeeping columns only) is not
  committed. An update of the id column is a delete of the old id and an insert of the new.

Unchanged TOASTed values ('u': PostgreSQL leaves them out of an update under the default replica
identity) are taken from the stored state. A row that cannot be mapped is set aside with the
reason (`SetAside`), never mis-mapped: a mapped column the relation no longer has (dropped or
renamed) or whose type changed, a `_value` that is not a JSON object, an id too long.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from publisher.bucket import Change
from publisher.capture import pgoutput as po
from publisher.config.capture import MORAY_VALUE, Table

_INTEGERS = {20, 21, 23, 26}  # int8, int2, int4, oid
_FLOATS = {700, 701}  # float4, float8
_BOOL, _JSON, _JSONB = 16, 114, 3802
TYPE_NAMES = {16: "bool", 20: "int8", 21: "int2", 23: "int4", 25: "text", 26: "oid",
              114: "json", 700: "float4", 701: "float8", 1043: "varchar", 1700: "numeric",
              2950: "uuid", 3802: "jsonb", 1184: "timestamptz", 1114: "timestamp"}


def _float(data: bytes) -> Any:
    number = float(data)
    return number if number - number == 0 else data.decode()  # NaN and infinities stay text


_CONVERTERS: dict[int, Callable[[bytes], Any]] = {
    **dict.fromkeys(_INTEGERS, int), **dict.fromkeys(_FLOATS, _float),
    _BOOL: lambda data: data == b"t", _JSON: orjson.loads, _JSONB: orjson.loads,
}
"""How a column's bytes become its JSON value, by type (`converter`; text by default)."""


def converter(type_oid: int) -> Callable[[bytes], Any]:
    """How the text of a column of type `type_oid` becomes its JSON value: integers, floats and
    booleans as such, json and jsonb parsed, every other type (numeric, timestamps, arrays,
    enums...) as its text."""
    return _CONVERTERS.get(type_oid, bytes.decode)


def type_name(oid: int) -> str:
    return TYPE_NAMES.get(oid, f"type {oid}")


@dataclass(frozen=True, slots=True)
class SetAside:
    """A row change that was not committed, and why."""

    table: str
    id: str | None
    reason: str
    lsn: int = 0
    """The commit LSN of its transaction."""

    def report(self) -> dict[str, Any]:
        return {"table": self.table, "id": self.id, "reason": self.reason,
                "lsn": po.format_lsn(self.lsn)}


class DDLChange(ValueError):
    """A relation no longer fits its table's mapping (a mapped column gone or retyped)."""


@dataclass(slots=True)
class Shape:
    """A mapped table's columns as the relation of its rows says, checked against the mapping
    and against the types first seen (`types`: column -> type oid)."""

    table: Table
    relation: po.Relation
    types: dict[str, int]
    problem: str | None = None
    """Why its rows are set aside (None: they map)."""
    id_at: int = -1
    """The id column's place among the relation's columns (-1: it has none)."""
    converters: tuple[tuple[str, Callable[[bytes], Any]], ...] = ()
    """Each column's name and how its bytes become its JSON value (`converter`)."""

    @classmethod
    def of(cls, table: Table, relation: po.Relation, types: dict[str, int]) -> Shape:
        names = [c.name for c in relation.columns]
        shape = cls(table, relation, types,
                    id_at=names.index(table.id) if table.id in names else -1,
                    converters=tuple((c.name, converter(c.type_oid))
                                     for c in relation.columns))
        have = {c.name: c.type_oid for c in relation.columns}
        keys = {c.name for c in relation.columns if c.key}
        if table.id in have and table.id not in keys:
            shape.problem = (f"column {table.id} of {table.qualified} is not in its replica "
                             "identity (its primary key): a delete could not name the id")
            return shape
        for column in sorted(table.mapped_columns):
            if column not in have:
                shape.problem = (f"column {column} of {table.qualified} is gone (dropped or "
                                 "renamed): the mapping needs it")
                break
            was = types.setdefault(column, have[column])
            if was != have[column]:
                shape.problem = (f"column {column} of {table.qualified} changed type from "
                                 f"{type_name(was)} to {type_name(have[column])}")
                break
        return shape

    def id_of(self, values: po.Tuple) -> str | None:
        """The id column's text in `values` (None when null or not sent)."""
        if not 0 <= self.id_at < len(values):
            return None
        value = values[self.id_at]
        return value.data.decode() if value.kind == "t" else None

    def row(self, values: po.Tuple) -> dict[str, Any]:
        """Column -> JSON value; po.UNCHANGED for an unchanged TOASTed value."""
        out: dict[str, Any] = {}
        for (name, convert), value in zip(self.converters, values, strict=False):
            kind = value.kind
            if kind == "u":
                out[name] = po.UNCHANGED
            elif kind == "n":
                out[name] = None
            else:
                out[name] = convert(value.data)
        return out


@dataclass(frozen=True, slots=True)
class RowChange:
    """One row of a transaction: `new` None for a delete; `old_id` the id before an update."""

    table: Table
    id: str
    new: dict[str, Any] | None
    old_id: str | None = None
    insert: bool = False


@dataclass(slots=True)
class Planned:
    """What a transaction commits: its changes in order, and the rows set aside."""

    changes: list[Change] = field(default_factory=list)
    set_aside: list[SetAside] = field(default_factory=list)


def state_of(table: Table, row: Mapping[str, Any], stored: Any) -> Any:
    """The resource's state of `row`: the row itself (unchanged TOASTed values from `stored`),
    or for a Moray table the object of its `_value`. Raises ValueError with the reason when it
    cannot be made."""
    filled = dict(row)
    for column, value in row.items():
        if value is po.UNCHANGED:
            if table.moray and column != MORAY_VALUE:
                filled[column] = None  # bookkeeping columns: not in the state
                continue
            if stored is None:
                raise ValueError(f"column {column} is an unchanged TOASTed value and the "
                                 "bucket holds no state to take it from")
            if table.moray:
                return stored
            filled[column] = stored.get(column)
    if not table.moray:
        return filled
    raw = filled.get(MORAY_VALUE)
    try:
        state = orjson.loads(raw) if isinstance(raw, str) else raw
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"_value is not JSON ({exc})") from None
    if not isinstance(state, dict):
        raise ValueError("_value is not a JSON object")
    return state


def announced(table: Table, every: Sequence[str], old: Any, new: Any) -> list[str]:
    """The sub-resources an update from state `old` to `new` announces (see the module)."""
    if old is None:
        return list(every)
    changed = [sub for sub, columns in table.sub_resources
               if any(old.get(c) != new.get(c) for c in columns)]
    return changed or list(every)


def plan(
    rows: Sequence[RowChange], current: MutableMapping[tuple[str, str], Any],
    sub_resources: Mapping[str, Sequence[str]], lsn: int = 0,
) -> Planned:
    """The changes of a transaction's `rows`, in order; `current` holds the bucket's state of
    each (resource, id) the rows touch (None: none), and is left holding the states the rows
    made (the next transaction of a group is planned on it). A row's change sees the states the
    rows before it left."""
    out = Planned()
    for row in rows:
        table, every = row.table, sub_resources[row.table.resource]
        key = (table.resource, row.id)
        if row.new is None:
            out.changes.append(Change.delete(table.resource, row.id, every))
            current[key] = None
            continue
        if row.old_id is not None and row.old_id != row.id:
            old_key = (table.resource, row.old_id)
            previous = current.get(old_key)
            out.changes.append(Change.delete(table.resource, row.old_id, every))
            current[old_key] = None
        else:
            previous = current.get(key)
        try:
            state = state_of(table, row.new, previous)
        except ValueError as exc:
            out.set_aside.append(SetAside(table.qualified, row.id, str(exc), lsn))
            continue
        if row.old_id is not None and row.old_id != row.id:
            previous = None  # a new id: an insert
        if previous is not None and previous == state and not row.insert:
            continue
        subs = list(every) if row.insert else announced(table, every, previous, state)
        out.changes.append(Change.put(table.resource, row.id, subs, state))
        current[key] = state
    return out
