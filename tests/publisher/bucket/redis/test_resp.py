"""The tail's reply reader: `RespReader` (Python) parses what hiredis parses, however the bytes
are split, and error replies come back as redis-py's exceptions. Pure: no I/O."""

from __future__ import annotations

from typing import Any

import hiredis
import pytest
import redis.exceptions

from publisher.bucket.redis.resp import RespReader, reader

# One wait-and-read as Redis sends it (an XREAD reply, then tail.lua's), a timed-out XREAD (nil),
# and the other RESP2 shapes.
WIRE = (
    b"*1\r\n*2\r\n$10\r\n{test}:log\r\n*1\r\n*2\r\n$15\r\n1700000000000-5\r\n"
    b"*6\r\n$1\r\nr\r\n$2\r\nvm\r\n$1\r\ns\r\n$7\r\n[\"nic\"]\r\n$1\r\ni\r\n$1\r\na\r\n"
    b"*8\r\n$10\r\nbenchbench\r\n$1\r\n1\r\n$15\r\n1700000000000-5\r\n$3\r\n0-0\r\n:1\r\n:5\r\n"
    b":5\r\n*1\r\n*2\r\n$15\r\n1700000000000-5\r\n*2\r\n$1\r\nr\r\n$2\r\nvm\r\n"
    b"*-1\r\n"
    b"$-1\r\n"
    b"+OK\r\n"
    b":-42\r\n"
    b"$0\r\n\r\n"
    b"*0\r\n"
)
EXPECTED: list[Any] = [
    [[b"{test}:log", [[b"1700000000000-5",
                       [b"r", b"vm", b"s", b'["nic"]', b"i", b"a"]]]]],
    [b"benchbench", b"1", b"1700000000000-5", b"0-0", 1, 5, 5,
     [[b"1700000000000-5", [b"r", b"vm"]]]],
    None,
    None,
    b"OK",
    -42,
    b"",
    [],
]


def _all(parser: Any, chunks: list[bytes]) -> list[Any]:
    out: list[Any] = []
    for chunk in chunks:
        parser.feed(chunk)
        while (reply := parser.gets()) is not False:
            out.append(reply)
    return out


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, len(WIRE)])
def test_the_python_reader_parses_what_hiredis_parses_however_the_bytes_are_split(
    size: int,
) -> None:
    chunks = [WIRE[at : at + size] for at in range(0, len(WIRE), size)]
    assert _all(RespReader(), chunks) == EXPECTED
    assert _all(hiredis.Reader(), chunks) == EXPECTED


@pytest.mark.parametrize("make", [RespReader, reader], ids=["python", "installed"])
def test_error_replies_are_returned_as_redis_py_exceptions_and_the_next_reply_still_read(
    make: Any,
) -> None:
    parser = make()
    parser.feed(b"-NOSCRIPT No matching script. Please use EVAL.\r\n-LOADING Redis is loading\r\n"
                b"-ERR user_script:1: boom\r\n:7\r\n")
    noscript, loading, other, seven = (parser.gets() for _ in range(4))
    assert isinstance(noscript, redis.exceptions.NoScriptError)
    assert isinstance(loading, redis.exceptions.BusyLoadingError)
    assert isinstance(other, redis.exceptions.ResponseError) and "boom" in str(other)
    assert seven == 7 and parser.gets() is False


def test_resp3_replies_are_read_too() -> None:
    parser = RespReader()
    parser.feed(b"%1\r\n+a\r\n:1\r\n_\r\n#t\r\n,1.5\r\n~1\r\n:2\r\n=7\r\ntxt:abc\r\n"
                b"!9\r\nERR blob!\r\n|1\r\n+ttl\r\n:3\r\n:4\r\n")
    replies = [parser.gets() for _ in range(8)]
    assert replies[:6] == [{b"a": 1}, None, True, 1.5, [2], b"abc"]
    assert isinstance(replies[6], redis.exceptions.ResponseError)
    assert replies[7] == 4, "an attribute is skipped, the reply it describes read"


def test_an_unknown_reply_type_is_a_protocol_error() -> None:
    parser = RespReader()
    parser.feed(b"?what\r\n")
    with pytest.raises(redis.exceptions.InvalidResponse):
        parser.gets()
