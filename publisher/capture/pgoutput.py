"""PostgreSQL's `pgoutput` logical replication messages (protocol version 1), decoded and encoded.

Pure code: bytes in, values out (and back, for tests and benchmarks). The format is PostgreSQL's
"Logical Replication Message Formats" (protocol.sgml): one message per XLogData payload, its
first byte its kind. Integers are big-endian; strings end with a zero byte; an LSN is an Int64;
a timestamp is microseconds since 2000-01-01 UTC. Streaming of in-progress transactions
(protocol version 2 and up) is not asked for, so no message carries a transaction id after its
kind, and every transaction arrives whole between its Begin and its Commit.

>>> decode(b"B" + bytes(20))
Begin(final_lsn=0, commit_time=0, xid=0)
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Kind = Literal["n", "u", "t", "b"]
"""A column's value in a tuple: null, unchanged TOASTed (not sent), text, binary."""


@dataclass(frozen=True, slots=True)
class Value:
    """One column of a tuple: its kind and, for 't' and 'b', its bytes."""

    kind: Kind
    data: bytes = b""

    @classmethod
    def text(cls, value: str) -> Value:
        return cls("t", value.encode())


NULL = Value("n")
UNCHANGED = Value("u")
"""An unchanged TOASTed value: PostgreSQL leaves it out of an update."""
Tuple = tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    """The LSN of the transaction's commit record."""
    commit_time: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    """The end of the commit record: the position to confirm once the transaction is applied."""
    commit_time: int


@dataclass(frozen=True, slots=True)
class Origin:
    lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class Column:
    flags: int
    """1: the column is part of the replica identity (the key)."""
    name: str
    type_oid: int
    type_modifier: int

    @property
    def key(self) -> bool:
        return bool(self.flags & 1)


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    namespace: str
    """'' for pg_catalog, as PostgreSQL sends it."""
    name: str
    replica_identity: int
    """The REPLICA IDENTITY setting's letter as a byte: d(efault), n(othing), f(ull), i(ndex)."""
    columns: tuple[Column, ...]

    @property
    def qualified(self) -> str:
        return f"{self.namespace or 'pg_catalog'}.{self.name}"


@dataclass(frozen=True, slots=True)
class Type:
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    relation: int
    new: Tuple


@dataclass(frozen=True, slots=True)
class Update:
    relation: int
    old: Tuple | None
    """The old key ('K', when the key changed) or old row ('O', REPLICA IDENTITY FULL)."""
    new: Tuple
    old_kind: Literal["K", "O"] | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    relation: int
    old: Tuple
    old_kind: Literal["K", "O"] = "K"


@dataclass(frozen=True, slots=True)
class Truncate:
    options: int
    """1: CASCADE, 2: RESTART IDENTITY."""
    relations: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Message:
    """pg_logical_emit_message's message."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes


Decoded = Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate | Message


class DecodeError(ValueError):
    """The bytes are not a pgoutput message of protocol version 1."""


class _Reader:
    __slots__ = ("at", "data")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        end = self.at + n
        if end > len(self.data):
            raise DecodeError(f"message ends after {len(self.data)} bytes, {end} needed")
        out = self.data[self.at : end]
        self.at = end
        return out

    def unpack(self, fmt: str) -> tuple[int, ...]:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def int8(self) -> int:
        return self.unpack(">B")[0]

    def int16(self) -> int:
        return self.unpack(">h")[0]

    def int32(self) -> int:
        return self.unpack(">i")[0]

    def uint32(self) -> int:
        return self.unpack(">I")[0]

    def int64(self) -> int:
        return self.unpack(">q")[0]

    def lsn(self) -> int:
        return self.unpack(">Q")[0]

    def string(self) -> str:
        end = self.data.find(b"\0", self.at)
        if end < 0:
            raise DecodeError("a string without its terminating zero byte")
        out = self.data[self.at : end].decode()
        self.at = end + 1
        return out

    def tuple(self) -> Tuple:
        values = []
        for _ in range(self.int16()):
            kind = chr(self.int8())
            if kind in ("t", "b"):
                values.append(Value(kind, self.take(self.int32())))  # type: ignore[arg-type]
            elif kind == "n":
                values.append(NULL)
            elif kind == "u":
                values.append(UNCHANGED)
            else:
                raise DecodeError(f"unknown tuple value kind {kind!r}")
        return tuple(values)

    def done(self, what: str) -> None:
        if self.at != len(self.data):
            raise DecodeError(f"{len(self.data) - self.at} bytes after the end of a {what}")


def decode(payload: bytes) -> Decoded:
    """The message of one XLogData payload; DecodeError when it is not one."""
    if not payload:
        raise DecodeError("an empty message")
    fast = _FAST.get(payload[0])
    if fast is not None:  # the messages of every transaction, read without a `_Reader`
        try:
            return fast(payload)
        except (struct.error, IndexError):
            raise DecodeError(f"a {chr(payload[0])!r} message of {len(payload)} bytes "
                              "ends early") from None
    r = _Reader(payload)
    kind = chr(r.int8())
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise DecodeError(f"unknown message kind {kind!r}")
    out = decoder(r)
    r.done(type(out).__name__)
    return out


_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">BQQq")
_OID_MARKER = struct.Struct(">IB")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_T, _B, _N, _U, _K, _O, _NEW = b"tbnuKON"


def _ended(payload: bytes, at: int, what: str) -> None:
    if at != len(payload):
        raise DecodeError(f"{len(payload) - at} bytes after the end of a {what}")


def _fast_begin(payload: bytes) -> Begin:
    _ended(payload, 1 + _BEGIN.size, "Begin")
    return Begin(*_BEGIN.unpack_from(payload, 1))


def _fast_commit(payload: bytes) -> Commit:
    _ended(payload, 1 + _COMMIT.size, "Commit")
    return Commit(*_COMMIT.unpack_from(payload, 1))


def _tuple_at(payload: bytes, at: int) -> tuple[Tuple, int]:
    """The tuple at offset `at` of `payload`, and the offset after it (`_Reader.tuple`)."""
    (count,) = _INT16.unpack_from(payload, at)
    at += 2
    values: list[Value] = []
    append = values.append
    for _ in range(count):
        kind = payload[at]
        at += 1
        if kind in (_T, _B):
            (size,) = _INT32.unpack_from(payload, at)
            end = at + 4 + size
            if size < 0 or end > len(payload):
                raise DecodeError(f"message ends after {len(payload)} bytes, {end} needed")
            append(Value("t" if kind == _T else "b", payload[at + 4 : end]))
            at = end
        elif kind == _N:
            append(NULL)
        elif kind == _U:
            append(UNCHANGED)
        else:
            raise DecodeError(f"unknown tuple value kind {chr(kind)!r}")
    return tuple(values), at


def _fast_insert(payload: bytes) -> Insert:
    oid, marker = _OID_MARKER.unpack_from(payload, 1)
    if marker != _NEW:
        raise DecodeError("an Insert without its new tuple")
    new, at = _tuple_at(payload, 6)
    _ended(payload, at, "Insert")
    return Insert(oid, new)


def _fast_update(payload: bytes) -> Update:
    oid, marker = _OID_MARKER.unpack_from(payload, 1)
    old, old_kind, at = None, None, 6
    if marker in (_K, _O):
        old, at = _tuple_at(payload, at)
        old_kind = chr(marker)
        marker = payload[at]
        at += 1
    if marker != _NEW:
        raise DecodeError(f"an Update with {chr(marker)!r} where its new tuple begins")
    new, at = _tuple_at(payload, at)
    _ended(payload, at, "Update")
    return Update(oid, old, new, old_kind)  # type: ignore[arg-type]


def _fast_delete(payload: bytes) -> Delete:
    oid, marker = _OID_MARKER.unpack_from(payload, 1)
    if marker not in (_K, _O):
        raise DecodeError(f"a Delete with {chr(marker)!r} where its old tuple begins")
    old, at = _tuple_at(payload, 6)
    _ended(payload, at, "Delete")
    return Delete(oid, old, chr(marker))  # type: ignore[arg-type]


_FAST: dict[int, Callable[[bytes], Decoded]] = {
    ord("B"): _fast_begin, ord("C"): _fast_commit, ord("I"): _fast_insert,
    ord("U"): _fast_update, ord("D"): _fast_delete,
}
"""The decoders of the messages every transaction has, by kind byte (the others use
`_Reader`)."""


def _begin(r: _Reader) -> Begin:
    return Begin(r.lsn(), r.int64(), r.uint32())


def _commit(r: _Reader) -> Commit:
    return Commit(r.int8(), r.lsn(), r.lsn(), r.int64())


def _origin(r: _Reader) -> Origin:
    return Origin(r.lsn(), r.string())


def _relation(r: _Reader) -> Relation:
    oid, namespace, name, identity = r.uint32(), r.string(), r.string(), r.int8()
    columns = tuple(
        Column(r.int8(), r.string(), r.uint32(), r.int32()) for _ in range(r.int16())
    )
    return Relation(oid, namespace, name, identity, columns)


def _type(r: _Reader) -> Type:
    return Type(r.uint32(), r.string(), r.string())


def _insert(r: _Reader) -> Insert:
    oid = r.uint32()
    if chr(r.int8()) != "N":
        raise DecodeError("an Insert without its new tuple")
    return Insert(oid, r.tuple())


def _update(r: _Reader) -> Update:
    oid = r.uint32()
    marker = chr(r.int8())
    old, old_kind = None, None
    if marker in ("K", "O"):
        old, old_kind = r.tuple(), marker
        marker = chr(r.int8())
    if marker != "N":
        raise DecodeError(f"an Update with {marker!r} where its new tuple begins")
    return Update(oid, old, r.tuple(), old_kind)  # type: ignore[arg-type]


def _delete(r: _Reader) -> Delete:
    oid = r.uint32()
    marker = chr(r.int8())
    if marker not in ("K", "O"):
        raise DecodeError(f"a Delete with {marker!r} where its old tuple begins")
    return Delete(oid, r.tuple(), marker)  # type: ignore[arg-type]


def _truncate(r: _Reader) -> Truncate:
    count, options = r.int32(), r.int8()
    return Truncate(options, tuple(r.uint32() for _ in range(count)))


def _message(r: _Reader) -> Message:
    flags, lsn, prefix = r.int8(), r.lsn(), r.string()
    return Message(bool(flags & 1), lsn, prefix, r.take(r.int32()))


_DECODERS: dict[str, Callable[[_Reader], Decoded]] = {
    "B": _begin, "C": _commit, "O": _origin, "R": _relation, "Y": _type, "I": _insert,
    "U": _update, "D": _delete, "T": _truncate, "M": _message,
}


def _string(value: str) -> bytes:
    return value.encode() + b"\0"


def _tuple(values: Tuple) -> bytes:
    out = [struct.pack(">h", len(values))]
    for value in values:
        out.append(value.kind.encode())
        if value.kind in ("t", "b"):
            out.append(struct.pack(">i", len(value.data)) + value.data)
    return b"".join(out)


def encode(message: Decoded) -> bytes:
    """The bytes PostgreSQL sends for `message` (decode's inverse)."""
    m = message
    if isinstance(m, Begin):
        return b"B" + struct.pack(">QqI", m.final_lsn, m.commit_time, m.xid)
    if isinstance(m, Commit):
        return b"C" + struct.pack(">BQQq", m.flags, m.commit_lsn, m.end_lsn, m.commit_time)
    if isinstance(m, Origin):
        return b"O" + struct.pack(">Q", m.lsn) + _string(m.name)
    if isinstance(m, Relation):
        head = b"R" + struct.pack(">I", m.oid) + _string(m.namespace) + _string(m.name)
        head += struct.pack(">Bh", m.replica_identity, len(m.columns))
        return head + b"".join(
            struct.pack(">B", c.flags) + _string(c.name) + struct.pack(">Ii", c.type_oid,
                                                                        c.type_modifier)
            for c in m.columns
        )
    if isinstance(m, Type):
        return b"Y" + struct.pack(">I", m.oid) + _string(m.namespace) + _string(m.name)
    if isinstance(m, Insert):
        return b"I" + struct.pack(">I", m.relation) + b"N" + _tuple(m.new)
    if isinstance(m, Update):
        old = b"" if m.old is None else (m.old_kind or "K").encode() + _tuple(m.old)
        return b"U" + struct.pack(">I", m.relation) + old + b"N" + _tuple(m.new)
    if isinstance(m, Delete):
        return b"D" + struct.pack(">I", m.relation) + m.old_kind.encode() + _tuple(m.old)
    if isinstance(m, Truncate):
        return b"T" + struct.pack(">iB", len(m.relations), m.options) + b"".join(
            struct.pack(">I", oid) for oid in m.relations
        )
    return (
        b"M" + struct.pack(">BQ", int(m.transactional), m.lsn) + _string(m.prefix)
        + struct.pack(">i", len(m.content)) + m.content
    )


def format_lsn(lsn: int) -> str:
    """PostgreSQL's text form of an LSN ('16/B374D848')."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """The LSN of PostgreSQL's text form ('16/B374D848'); ValueError when it is not one."""
    high, sep, low = text.partition("/")
    if not sep:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(high, 16) << 32) | int(low, 16)
