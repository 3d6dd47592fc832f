"""The conformance checks' view of the wire: open a websocket, send a frame, and see what the
publisher answered — a reply, a close frame (code and reason), a dropped connection, an HTTP
refusal of the upgrade, or silence.

A deliberately bare client (the `websockets` library, no retries, no listener logic), so that
what the checks judge is the publisher's behaviour and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from changefeed.errors import ProtocolError
from changefeed.protocol import json_object
from changefeed_testing.conformance.outcome import Failed


@dataclass(frozen=True, slots=True)
class Closed:
    """The publisher ended the connection: `code` and `reason` of its close frame, or
    `code=None` when the connection dropped without one (what clients report as 1006)."""

    code: int | None
    reason: str

    def describe(self) -> str:
        if self.code is None:
            return "the connection dropped without a close frame"
        reason = f" {self.reason!r}" if self.reason else ""
        return f"closed with {self.code}{reason}"


@dataclass(frozen=True, slots=True)
class Silence:
    """Nothing arrived within the wait."""

    seconds: float


Received = dict[str, Any] | Closed | Silence


def closed_of(exc: ConnectionClosed) -> Closed:
    if exc.rcvd is None:
        return Closed(None, "")
    return Closed(exc.rcvd.code, exc.rcvd.reason)


@contextlib.asynccontextmanager
async def socket(
    ws_url: str, version: str | None, timeout: float
) -> AsyncIterator[ClientConnection]:
    """A websocket to `ws_url` with `Accept-Version: version` (no header for None).

    Raises Failed when the upgrade is refused or the publisher cannot be reached."""
    headers = {"Accept-Version": version} if version is not None else {}
    try:
        ws = await connect(
            ws_url, additional_headers=headers, open_timeout=timeout, max_size=None,
            compression=None, proxy=None, ping_interval=None,
        )
    except InvalidStatus as exc:
        status = exc.response.status_code
        body = exc.response.body.decode(errors="replace")[:200] if exc.response.body else ""
        raise Failed(f"websocket upgrade refused: HTTP {status} {body}".strip()) from None
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        raise Failed(f"cannot open a websocket to {ws_url}: {exc!r}") from None
    try:
        yield ws
    finally:
        with contextlib.suppress(Exception):  # closing is best effort: the check is decided
            await asyncio.wait_for(ws.close(), timeout)


async def receive(ws: ClientConnection, seconds: float) -> Received:
    """The next frame as a JSON object, or how the connection ended, or Silence.

    Raises Failed when the frame is binary, not JSON, or not a JSON object."""
    try:
        frame = await asyncio.wait_for(ws.recv(), seconds)
    except TimeoutError:
        return Silence(seconds)
    except ConnectionClosed as exc:
        return closed_of(exc)
    if isinstance(frame, bytes):
        raise Failed(f"the publisher sent a binary frame: {frame[:80]!r}")
    try:
        return json_object(frame, "the publisher's text frame")
    except ProtocolError as exc:
        raise Failed(str(exc)) from None


def encode(frame: dict[str, Any] | str | bytes) -> str | bytes:
    """A registration as sent: objects as JSON text, strings and bytes as they are."""
    return frame if isinstance(frame, str | bytes) else orjson.dumps(frame).decode()


async def reply_to(
    ws: ClientConnection, frame: dict[str, Any] | str | bytes, seconds: float
) -> dict[str, Any]:
    """Send a registration and return the publisher's reply. Raises Failed otherwise."""
    await ws.send(encode(frame))
    answer = await receive(ws, seconds)
    if isinstance(answer, Closed):
        raise Failed(f"registration refused: {answer.describe()}")
    if isinstance(answer, Silence):
        raise Failed(f"no registration reply within {seconds:g} s")
    return answer


async def close_after(
    ws_url: str, frame: dict[str, Any] | str | bytes, version: str | None, seconds: float
) -> Received:
    """Send `frame` as the first frame and return what the publisher did: a reply (dict), a
    close, or nothing within `seconds`."""
    async with socket(ws_url, version, seconds) as ws:
        with contextlib.suppress(ConnectionClosed):
            await ws.send(encode(frame))
        return await receive(ws, seconds)
