"""Decoded pgoutput messages assembled into whole transactions of mapped row changes (pure).

Fed one message at a time (`feed`), in the order the slot sends them; returns a `Transaction`
at each Commit. Relations are remembered by oid (PostgreSQL sends one before the first row of a
relation in a session and again after its DDL); a relation of a mapped table is checked against
its mapping each time (publisher.capture.rows.Shape), and a change of its fit is reported once
(`reports`). Rows of unmapped relations are ignored (the publication should not send them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from publisher.capture import pgoutput as po
from publisher.capture.rows import RowChange, SetAside, Shape
from publisher.config.capture import Capture, Table


@dataclass(slots=True)
class Transaction:
    """One committed transaction's mapped rows, in order."""

    begin: po.Begin
    rows: list[RowChange] = field(default_factory=list)
    set_aside: list[SetAside] = field(default_factory=list)
    truncated: list[Table] = field(default_factory=list)
    commit: po.Commit | None = None

    @property
    def lsn(self) -> int:
        """The commit LSN: what names the transaction (its idempotency key)."""
        return self.begin.final_lsn

    @property
    def end_lsn(self) -> int:
        """The end of its commit record: the position to confirm once it is applied."""
        assert self.commit is not None
        return self.commit.end_lsn

    @property
    def empty(self) -> bool:
        return not (self.rows or self.truncated)


class ProtocolViolation(ValueError):
    """The slot sent messages out of the order pgoutput keeps (a row outside a transaction)."""


class Assembler:
    """Turns the slot's messages into `Transaction`s.

    >>> assembler = Assembler(config.capture)
    >>> for payload in payloads:
    ...     if (txn := assembler.feed(pgoutput.decode(payload))) is not None: apply(txn)
    """

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self.shapes: dict[int, Shape | None] = {}
        """Relation oid -> its table's shape (None: not a mapped table)."""
        self.types: dict[str, dict[str, int]] = {}
        """Table -> the type of each mapped column when first seen (a change is a DDL report)."""
        self.reports: list[str] = []
        """DDL changes found, newest last (the caller drains them)."""
        self._problems: dict[str, str | None] = {}
        self.current: Transaction | None = None

    @property
    def in_transaction(self) -> bool:
        return self.current is not None

    def feed(self, message: po.Decoded) -> Transaction | None:
        kind = type(message)  # a transaction's messages first: the common case
        if kind is po.Insert or kind is po.Update or kind is po.Delete:
            if self.current is None:
                raise ProtocolViolation(f"{kind.__name__} outside a transaction")
            self._row(self.current, message)  # type: ignore[arg-type]
            return None
        if kind is po.Begin:
            self.current = Transaction(message)  # type: ignore[arg-type]
            return None
        if isinstance(message, po.Relation):
            self._relation(message)
            return None
        if isinstance(message, po.Type | po.Origin | po.Message):
            return None
        txn = self.current
        if txn is None:
            raise ProtocolViolation(f"{type(message).__name__} outside a transaction")
        if isinstance(message, po.Commit):
            txn.commit = message
            self.current = None
            return txn
        if isinstance(message, po.Truncate):
            txn.truncated += [s.table for oid in message.relations
                              if (s := self.shapes.get(oid)) is not None]
        return None

    def _relation(self, relation: po.Relation) -> None:
        table = self.capture.table(relation.qualified)
        if table is None:
            self.shapes[relation.oid] = None
            return
        shape = Shape.of(table, relation, self.types.setdefault(table.qualified, {}))
        self.shapes[relation.oid] = shape
        if self._problems.get(table.qualified) != shape.problem:
            self._problems[table.qualified] = shape.problem
            self.reports.append(shape.problem or f"{table.qualified} fits its mapping again")

    def _row(self, txn: Transaction, message: po.Insert | po.Update | po.Delete) -> None:
        if message.relation not in self.shapes:
            raise ProtocolViolation(f"a row of relation {message.relation} before its Relation")
        shape = self.shapes[message.relation]
        if shape is None:
            return
        table = shape.table
        values = message.old if isinstance(message, po.Delete) else message.new
        id = shape.id_of(values)
        if shape.problem is not None:
            txn.set_aside.append(SetAside(table.qualified, id, shape.problem, txn.lsn))
            return
        if id is None:
            txn.set_aside.append(SetAside(table.qualified, None, f"{table.id} is null", txn.lsn))
            return
        if isinstance(message, po.Delete):
            txn.rows.append(RowChange(table, id, None))
            return
        old_id = None
        if isinstance(message, po.Update) and message.old is not None:
            old_id = shape.id_of(message.old)
        txn.rows.append(RowChange(table, id, shape.row(message.new), old_id,
                                  insert=isinstance(message, po.Insert)))
