"""Redis replies parsed from bytes as they arrive: hiredis's reader when it is installed (the
`fast` extra), else `RespReader`, the same interface in Python. Pure: no I/O.

Both take bytes with `feed` and give one whole reply per `gets` (False while the next one is
incomplete). An error reply comes back as the redis-py exception it is (`NOSCRIPT` as
`NoScriptError`, `LOADING` as `BusyLoadingError`...), returned rather than raised, so that the
replies of a pipeline after it are still read.
"""

from __future__ import annotations

from typing import Any, Protocol

from redis._parsers.base import BaseParser
from redis.exceptions import InvalidResponse

try:
    import hiredis
except ImportError:  # pragma: no cover - the test extra installs hiredis; RespReader is tested
    hiredis = None  # type: ignore[assignment]


class Reader(Protocol):
    def feed(self, data: bytes, /) -> None: ...

    def gets(self) -> Any: ...


class _Incomplete(Exception):
    """The buffer ends inside the reply being parsed."""


_NIL = object()


def _error(message: str) -> Exception:
    """The redis-py exception of an error reply (`NOSCRIPT ...` is a `NoScriptError`)."""
    error: Exception = BaseParser.parse_error(message)  # type: ignore[no-untyped-call]
    return error


class RespReader:
    """RESP2 and RESP3 replies (what the tail is sent) from a byte stream, in Python."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._at = 0

    def feed(self, data: bytes, /) -> None:
        if self._at:
            del self._buffer[: self._at]
            self._at = 0
        self._buffer += data

    def gets(self) -> Any:
        try:
            reply, self._at = self._parse(self._at)
        except _Incomplete:
            return False
        return None if reply is _NIL else reply

    def _line(self, at: int) -> tuple[bytes, int]:
        end = self._buffer.find(b"\r\n", at)
        if end < 0:
            raise _Incomplete
        return bytes(self._buffer[at:end]), end + 2

    def _parse(self, at: int) -> tuple[Any, int]:
        if at >= len(self._buffer):
            raise _Incomplete
        kind = bytes(self._buffer[at : at + 1])
        line, at = self._line(at + 1)
        if kind in (b"$", b"=", b"!"):  # bulk string, verbatim (format first), blob error
            size = int(line)
            if size < 0:
                return _NIL, at
            end = at + size
            if len(self._buffer) < end + 2:
                raise _Incomplete
            value = bytes(self._buffer[at:end])
            if kind == b"!":
                return _error(value.decode(errors="replace")), end + 2
            return (value[4:] if kind == b"=" else value), end + 2
        if kind in (b"*", b"~", b">", b"%", b"|"):
            count = int(line)
            if count < 0:
                return _NIL, at
            items: list[Any] = []
            for _ in range(2 * count if kind in (b"%", b"|") else count):
                item, at = self._parse(at)
                items.append(None if item is _NIL else item)
            if kind == b"|":  # attributes precede the reply they describe
                return self._parse(at)
            if kind == b"%":
                return dict(zip(items[::2], items[1::2], strict=True)), at
            return items, at
        if kind == b":" or kind == b"(":
            return int(line), at
        if kind == b"+":
            return line, at
        if kind == b"-":
            return _error(line.decode(errors="replace")), at
        if kind == b"_":
            return _NIL, at
        if kind == b"#":
            return line == b"t", at
        if kind == b",":
            return float(line), at
        raise InvalidResponse(f"protocol error: reply type {kind!r}")


def reader() -> Reader:
    """hiredis's reader when installed, else `RespReader`: bytes, not decoded."""
    if hiredis is not None:
        parser: Reader = hiredis.Reader(protocolError=InvalidResponse, replyError=_error)
        return parser
    return RespReader()


__all__ = ["Reader", "RespReader", "reader"]
