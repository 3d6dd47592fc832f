"""One websocket connection to a publisher: carries out what `listener.state` decides.

`Connection.open` connects, sends the registration and reads the reply; then a reader task
moves every frame through the core (`ListenerCore.item`) into the buffer and aborts (closes the
socket) when the core says so; a heartbeat task sends `heartbeat` like node-sdc-changefeed.
Errors of websockets and aiohttp become the listener's own here (`translate_errors`), and
nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Literal

import aiohttp
import orjson
import websockets
from websockets.asyncio.client import ClientConnection, connect

from changefeed.errors import (
    AccessDenied,
    BootstrapFailed,
    ChangefeedError,
    ConnectionLost,
    FetchFailed,
)
from changefeed.logs import get_logger
from changefeed.protocol import HEARTBEAT, ChangeItem, CloseCode
from listener.buffer import Buffer
from listener.config import ListenerConfig
from listener.options import ClientOptions
from listener.pager import Page, Pager
from listener.state import Attempt, ListenerCore

log = get_logger(__name__)

Via = Literal["websocket", "bootstrap", "fetch"]

DENIED = frozenset({401, 403})
"""Statuses that refuse the credentials, scope or origin: raised (AccessDenied), not retried."""


def access_denied(url: str, status: int, body: bytes) -> AccessDenied:
    """The AccessDenied of a 401 or 403, with the publisher's `{code, message}` if it sent one."""
    try:
        error = orjson.loads(body)
        code, message = str(error["code"]), str(error["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        code, message = "", body[:200].decode(errors="replace")
    return AccessDenied(url, status, code, message)


@contextlib.asynccontextmanager
async def translate_errors(url: str, via: Via) -> AsyncIterator[None]:
    """The one place where errors of websockets and aiohttp become the listener's."""
    try:
        yield
    except websockets.exceptions.ConnectionClosed as exc:
        code = exc.rcvd.code if exc.rcvd is not None else int(CloseCode.ABNORMAL_CLOSURE)
        reason = exc.rcvd.reason if exc.rcvd is not None else ""
        raise ConnectionLost(url, f"websocket closed ({exc})", code, reason) from exc
    except websockets.exceptions.InvalidStatus as exc:
        status = exc.response.status_code
        if status in DENIED:
            raise access_denied(url, status, bytes(exc.response.body or b"")) from None
        raise ConnectionLost(url, f"upgrade refused with HTTP {status}", status=status) from exc
    except websockets.exceptions.WebSocketException as exc:
        raise ConnectionLost(url, f"websocket failed ({exc})") from exc
    except aiohttp.ClientResponseError as exc:
        if via == "fetch":
            raise FetchFailed(url, str(exc), exc.status) from exc
        raise BootstrapFailed(url, str(exc), exc.status) from exc
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if via == "fetch":
            raise FetchFailed(url, why) from exc
        if via == "bootstrap":
            raise BootstrapFailed(url, why) from exc
        raise ConnectionLost(url, f"could not connect ({why})") from exc


class Connection:
    """A registered websocket whose change items flow into `buffer`."""

    def __init__(
        self, attempt: Attempt, ws: ClientConnection, reply: str | bytes,
        core: ListenerCore, buffer: Buffer, config: ListenerConfig,
    ) -> None:
        self.attempt = attempt
        self.reply = reply
        self.failure: BaseException | None = None
        """Why the reader stopped; raised once the buffered items are delivered."""
        self._ws = ws
        self._core = core
        self._buffer = buffer
        self._config = config
        self._arrived = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, attempt: Attempt, core: ListenerCore, buffer: Buffer, config: ListenerConfig,
        options: ClientOptions,
    ) -> AsyncIterator[Connection]:
        """Connect, register and read the reply within `options.open_timeout`, pinging as
        `options` says (its timeouts resolved: none None); the reader runs until the block
        exits."""
        credentials = options.credentials
        headers = {**attempt.headers, **credentials.headers_for(attempt.ws_url, attempt.url)}
        secure = attempt.ws_url.startswith("wss:")
        async with translate_errors(attempt.url, "websocket"):
            async with asyncio.timeout(options.open_timeout):
                ws = await connect(
                    attempt.ws_url,
                    additional_headers=headers,
                    ssl=(credentials.ssl or True) if secure else None,
                    ping_interval=options.ping_interval or None,
                    ping_timeout=options.ping_timeout or None,
                    open_timeout=None,
                    close_timeout=2,
                )
        try:
            async with translate_errors(attempt.url, "websocket"):
                await ws.send(attempt.frame)
                async with asyncio.timeout(options.open_timeout):
                    reply = await ws.recv()
            connection = cls(attempt, ws, reply, core, buffer, config)
            connection._tasks.append(asyncio.create_task(connection._read()))
            if config.heartbeat_interval is not None:
                connection._tasks.append(asyncio.create_task(connection._heartbeat()))
            try:
                yield connection
            finally:
                for task in connection._tasks:
                    task.cancel()
                await asyncio.gather(*connection._tasks, return_exceptions=True)
        finally:
            await close_dropping(ws)

    def check(self) -> None:
        """Raise the reader's failure, if any (between bootstrap pages)."""
        if self.failure is not None:
            raise self.failure

    async def next_item(self) -> ChangeItem:
        """The oldest buffered item; waits for one. Raises the reader's failure once empty."""
        while True:
            self._arrived.clear()
            item = await self._buffer.pop()
            if item is not None:
                return item
            self.check()
            await self._arrived.wait()

    async def _read(self) -> None:
        url = self.attempt.url
        try:
            while True:
                async with translate_errors(url, "websocket"):
                    frame = await self._ws.recv()
                item = self._core.item(frame)
                if item is None:
                    continue
                length = await self._buffer.push(item)
                self._arrived.set()
                self._core.check_buffer(length)
        except ChangefeedError as exc:
            self.failure = exc
        except Exception as exc:  # a bug: handed to the application, which raises it
            log.exception("listener reader failed", url=url)
            self.failure = exc
        self._arrived.set()
        await close_dropping(self._ws)

    async def _heartbeat(self) -> None:
        assert self._config.heartbeat_interval is not None
        while True:
            await asyncio.sleep(self._config.heartbeat_interval)
            try:
                await self._ws.send(HEARTBEAT)
            except websockets.exceptions.ConnectionClosed:
                return  # the reader reports why


async def close_dropping(ws: ClientConnection) -> None:
    """Close the websocket, dropping what the publisher sends meanwhile.

    websockets stops reading from the socket while received frames wait to be read; closing
    without reading them would not see the publisher's close frame behind them, and would wait
    out the close timeout.
    """
    closing = asyncio.create_task(ws.close())
    with contextlib.suppress(websockets.exceptions.ConnectionClosed):
        while not closing.done():
            await ws.recv()
    await closing


async def fetch_page(
    session: aiohttp.ClientSession, pager: Pager, url: str, headers: dict[str, str]
) -> Page:
    """GET one bootstrap page and let the pager read it."""
    async with translate_errors(url, "bootstrap"), session.get(url, headers=headers) as response:
        body = await response.read()
        if response.status in DENIED:
            raise access_denied(url, response.status, body)
        if response.status != 200:
            raise BootstrapFailed(url, f"HTTP {response.status}: {body[:200]!r}", response.status)
        return pager.parse(url, dict(response.headers), body)
