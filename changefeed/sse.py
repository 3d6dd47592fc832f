"""Server-sent events (the WHATWG `text/event-stream` format): the change feed for browsers and
`curl -N`, one place for its bytes. Pure code: no sockets, no clocks.

An event is `id: <cursor>`, `event: <name>` and `data: <one line of JSON>` lines and a blank
line; a line starting with `:` is a comment (the publisher's heartbeat). The publisher sends the
events of a stream as HTTP/1.1 chunks written straight to the connection's transport, as it does
websocket frames (`chunk`), so one item's bytes are built once for every SSE subscriber.
docs/sse.md documents the stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import orjson

CHANGE = "change"
"""An item of the feed: `data` is the item exactly as a websocket carries it."""
REGISTERED = "registered"
"""The first event: `data` is the websocket registration reply (cursor, resumed, routes)."""
RESYNC = "resync"
"""`since` (or Last-Event-ID) could not be resumed: `data` is `{"reason"}`; bootstrap again."""
CLOSE = "close"
"""The last event before the publisher ends the stream: `data` is `{"code", "reason"}` with the
websocket close code it would have sent (4008 slow consumer, 4009 bootstrap again, ...)."""
PING = b": ping\n\n"
"""The heartbeat: a comment, which EventSource ignores."""
END = b"0\r\n\r\n"
"""The last chunk of a chunked HTTP/1.1 body."""


def event(name: str, data: bytes, id: str | None = None) -> bytes:
    """One event; `data` must be one line (compact JSON is)."""
    head = b"id: " + id.encode() + b"\n" if id is not None else b""
    return head + b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"


def chunk(data: bytes) -> bytes:
    """`data` as one HTTP/1.1 chunk."""
    return b"%x\r\n%b\r\n" % (len(data), data)


def change_chunk(cursor: str, payload: bytes) -> bytes:
    """A change item (its JSON `payload`) as the chunk of a `change` event with id `cursor`."""
    return chunk(event(CHANGE, payload, cursor))


def close_chunks(code: int, reason: str) -> bytes:
    """The `close` event and the end of the body: what a stream's last write is."""
    return chunk(event(CLOSE, orjson.dumps({"code": code, "reason": reason}))) + END


@dataclass(frozen=True, slots=True)
class Event:
    """An event as a client reads it."""

    name: str
    data: str
    id: str | None = None


class EventParser:
    """Feed it the text of a stream (unchunked); `events()` drains what it completed. For tests
    and Python clients; comments are dropped, as EventSource does."""

    def __init__(self) -> None:
        self._text = ""
        self._done: list[Event] = []

    def feed(self, text: str) -> None:
        self._text += text.replace("\r\n", "\n")
        while "\n\n" in self._text:
            block, self._text = self._text.split("\n\n", 1)
            fields: dict[str, str] = {}
            for line in block.split("\n"):
                if not line or line.startswith(":"):
                    continue
                key, _, value = line.partition(":")
                fields[key] = value[1:] if value.startswith(" ") else value
            if "data" in fields or "event" in fields:
                self._done.append(
                    Event(fields.get("event", "message"), fields.get("data", ""), fields.get("id"))
                )

    def events(self) -> Iterator[Event]:
        done, self._done = self._done, []
        yield from done


__all__ = [
    "CHANGE",
    "CLOSE",
    "END",
    "PING",
    "REGISTERED",
    "RESYNC",
    "Event",
    "EventParser",
    "change_chunk",
    "chunk",
    "close_chunks",
    "event",
]
