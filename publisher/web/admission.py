"""Admission of TCP connections, before aiohttp sees a byte of them.

- At most `server.maxConnections` open connections, and `server.maxConnectionsPerClient` from one
  client address. One more is answered `503 TooManyConnections` (with `Retry-After`) and closed,
  and the refusal logged once per client address per interval. The cap is kept below the
  process's open-file limit, so accepting never fails for want of a file descriptor.
- Upgraded (websocket) connections have their frames checked for masks (`publisher.web.frames`):
  an unmasked frame is answered with close code 1002 (`CloseCode.PROTOCOL_ERROR`) and the
  connection closed.

`Guard` is the asyncio protocol of every accepted connection: it admits it or refuses it, then
passes every event on to aiohttp's own protocol (a `RequestHandler`) unchanged.
"""

from __future__ import annotations

import asyncio
import resource
from collections import Counter
from collections.abc import Callable, Container
from typing import Any, cast

import orjson
import structlog

from changefeed.protocol import CloseCode, close_frame
from publisher.config.logs import Throttle
from publisher.web.frames import ClientFrames

log = structlog.get_logger(__name__)

REFUSAL_LINGER = 1.0
"""Seconds a refused connection is kept after its 503, reading (and dropping) what the client
still sends, so that closing does not reset the connection before the client reads the 503."""
MAX_LINGERING = 16
"""Refused connections lingering at once, at most; past it they are closed right away."""
RESERVED_FILES = 32
"""File descriptors kept free of connections: Redis, the listening socket, logs, the embedded
Redis's pipes, lingering refusals."""
RETRY_AFTER = 1
UNMASKED = "client frames must be masked (RFC 6455 5.1)"


def file_limit() -> int:
    """The process's soft limit of open files."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def fitting_cap(wanted: int, files: int, reserved: int) -> int:
    """The most connections a process with `files` open files allowed may hold, at most
    `wanted`, keeping `reserved` files for everything else (pure)."""
    return max(1, min(wanted, files - reserved))


def refusal(status: int, code: str, message: str, retry_after: int = RETRY_AFTER) -> bytes:
    """A complete HTTP/1.1 response that closes the connection, with our JSON error body."""
    body = orjson.dumps({"code": code, "message": message})
    reason = {503: "Service Unavailable"}.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Retry-After: {retry_after}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


class Admission:
    """The counts of open connections, in total and per client address."""

    def __init__(
        self,
        most: int,
        per_client: int,
        log_interval: float = 10.0,
        exempt: Container[str] = (),
    ) -> None:
        self.most = most
        self.per_client = per_client
        self.exempt = exempt
        """Peer addresses without a per-client cap: trusted proxies, which carry many clients
        (`publisher.security.clientaddr.Trusted`)."""
        self.refusals: Counter[str] = Counter()
        """Connections refused since start, by the limit that refused them (for metrics)."""
        self.open = 0
        self.lingering = 0
        self._by_client: dict[str, int] = {}
        self._log = Throttle(log_interval)

    def limit(self, most: int, per_client: int, exempt: Container[str]) -> None:
        """Admit at most `most` connections, `per_client` from one address not in `exempt`,
        from now on (the config's caps, at start and on reload; those open stay open)."""
        self.most, self.per_client, self.exempt = most, per_client, exempt

    def admit(self, client: str) -> str | None:
        """Count a new connection from `client`, or say why it is refused (nothing counted)."""
        if self.open >= self.most:
            self.refusals["max_connections"] += 1
            return f"too many connections ({self.most}, server.maxConnections)"
        mine = self._by_client.get(client, 0)
        if mine >= self.per_client and client not in self.exempt:
            self.refusals["max_connections_per_client"] += 1
            return (
                f"too many connections from {client} "
                f"({self.per_client}, server.maxConnectionsPerClient)"
            )
        self.open += 1
        self._by_client[client] = mine + 1
        return None

    def release(self, client: str) -> None:
        self.open -= 1
        left = self._by_client[client] - 1
        if left:
            self._by_client[client] = left
        else:
            del self._by_client[client]

    def refused(self, client: str, why: str) -> None:
        suppressed = self._log.allow(client)
        if suppressed is not None:
            log.warning(
                "connection refused", client=client, reason=why, open=self.open,
                suppressed=suppressed,
            )


def _client_of(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else "local"


class Guard(asyncio.Protocol):
    """The protocol of one accepted connection: admission, then aiohttp's `RequestHandler`."""

    __slots__ = (
        "_admission", "_client", "_frames", "_inner", "_lingering", "_make", "_transport",
        "violation",
    )

    def __init__(self, admission: Admission, make_handler: Callable[[], Any]) -> None:
        self._admission = admission
        self._make = make_handler
        self._inner: Any = None
        self._client = ""
        self._transport: asyncio.Transport | None = None
        self._frames: ClientFrames | None = None
        self._lingering = False
        self.violation: str | None = None
        """Why the guard closed an upgraded connection (an unmasked frame), for the log."""

    # --- admission ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport of whatever loop serves (uvloop's is no asyncio.Transport subclass).
        self._transport = cast(asyncio.Transport, transport)
        transport = self._transport
        self._client = _client_of(transport)
        why = self._admission.admit(self._client)
        if why is None:
            self._inner = self._make()
            self._inner.connection_made(transport)
            return
        self._admission.refused(self._client, why)
        transport.write(refusal(503, "TooManyConnections", why))
        if self._admission.lingering >= MAX_LINGERING or not transport.can_write_eof():
            transport.close()
            return
        self._admission.lingering += 1
        self._lingering = True
        transport.write_eof()
        asyncio.get_running_loop().call_later(REFUSAL_LINGER, transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is None:
            if self._lingering:
                self._admission.lingering -= 1
            return
        self._admission.release(self._client)
        inner, self._inner = self._inner, None
        inner.connection_lost(exc)

    # --- websocket frames --------------------------------------------------------------------

    def expect_frames(self) -> None:
        """From now on the client sends websocket frames: check each is masked."""
        self._frames = ClientFrames()

    def expect_requests(self) -> None:
        """The upgrade did not happen: the client goes on sending HTTP requests."""
        self._frames = None

    # --- passed on to aiohttp ----------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._inner is None or self.violation is not None:
            return  # refused, or closed for a bad frame: what it still sends is dropped
        if self._frames is not None and not self._frames.feed(data):
            self._refuse_frame()
            return
        self._inner.data_received(data)

    def _refuse_frame(self) -> None:
        self._frames = None
        self.violation = UNMASKED
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(close_frame(CloseCode.PROTOCOL_ERROR, UNMASKED))
            transport.close()

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


__all__ = ["Admission", "Guard", "file_limit", "fitting_cap", "refusal"]
