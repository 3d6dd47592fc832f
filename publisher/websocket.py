"""The websocket side of /changefeeds: registration, then the hub writes to the socket.

One handler task per connection reads what the listener sends (its registration, then `heartbeat`
texts, pongs) and unregisters it the moment it goes away (registrations are ephemeral, RFD 5).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import orjson
import structlog
from aiohttp import WSMsgType, web

from changefeed.cursor import Cursor, StreamId
from changefeed.errors import BucketUnavailable, CursorError, RegistrationError
from changefeed.protocol import (
    HEARTBEAT,
    CloseCode,
    Registration,
    accept_version,
    close_reason,
    parse_registration,
    registration_reply,
    text_frame,
)
from publisher.hub import Connection

if TYPE_CHECKING:
    from publisher.service import Service

log = structlog.get_logger(__name__)

UNAVAILABLE = "change bucket unavailable, try again later"


async def handle_websocket(request: web.Request, service: Service) -> web.WebSocketResponse:
    limits = service.config.limits
    try:
        version = accept_version(request.headers.get("Accept-Version"))
    except RegistrationError as exc:
        raise web.HTTPBadRequest(
            text=orjson.dumps({"code": "BadAcceptVersion", "message": exc.reason}).decode(),
            content_type="application/json",
        ) from None
    ws = web.WebSocketResponse(
        heartbeat=limits.ping_interval,
        max_msg_size=limits.registration_bytes,
        compress=False,
        timeout=5.0,
    )
    await ws.prepare(request)
    remote = f"{request.remote}"
    service.unregistered.add(ws)
    try:
        registered = await _register(ws, version, service, remote)
    finally:
        service.unregistered.discard(ws)
    if registered is None:
        return ws
    registration, since = registered
    transport = request.transport
    if transport is None or transport.is_closing():
        return ws

    hub = service.hub
    # From here to hub.add nothing awaits: the reply's cursor is exactly where the stream starts.
    head = hub.window.head
    reply = registration_reply(
        registration, service.resources, Cursor(hub.epoch, head).encode(), since is not None
    )
    transport.write(text_frame(orjson.dumps(reply)))
    # The protocol pauses (and drains) above the send buffer: what the hub counts as slow.
    transport.set_write_buffer_limits(high=limits.send_buffer)
    conn = Connection(registration, transport, request.protocol, remote)
    hub.add(conn, since if since is not None else head)
    bound = log.bind(
        instance=registration.instance,
        service=registration.service,
        resources=[k.resource for k in registration.kinds],
        remote=remote,
    )
    bound.info(
        "listener registered",
        version=registration.version,
        resumed=since is not None,
        listeners=len(hub.connections),
    )
    reason = await _read_until_closed(ws)
    hub.remove(conn)
    if conn.closing:
        reason = "closed by publisher"
    bound.info("listener disconnected", reason=reason, listeners=len(hub.connections))
    return ws


async def _refuse(ws: web.WebSocketResponse, code: int, reason: str, remote: str) -> None:
    log.info("registration refused", code=code, reason=reason, remote=remote)
    await ws.close(code=code, message=close_reason(reason).encode())


async def _register(
    ws: web.WebSocketResponse, version: int, service: Service, remote: str
) -> tuple[Registration, StreamId | None] | None:
    """Read and check the registration; None when the socket was refused (and closed)."""
    timeout = service.config.limits.registration_timeout
    try:
        message = await ws.receive(timeout=timeout)
    except TimeoutError:
        await _refuse(
            ws, CloseCode.POLICY_VIOLATION, f"no registration within {timeout:g} s", remote
        )
        return None
    if message.type is WSMsgType.ERROR:
        # aiohttp has closed it already (1009 for an oversized frame).
        log.info(
            "registration refused", remote=remote, code=ws.close_code, reason=str(message.data)
        )
        return None
    if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
        return None
    if message.type is not WSMsgType.TEXT:
        await _refuse(ws, CloseCode.UNSUPPORTED_DATA, "registration must be a text frame", remote)
        return None
    try:
        registration = parse_registration(message.data, version, service.resources)
    except RegistrationError as exc:
        await _refuse(ws, exc.close_code, exc.reason, remote)
        return None
    if not service.tail.healthy:
        await _refuse(ws, CloseCode.TRY_AGAIN_LATER, UNAVAILABLE, remote)
        return None
    if registration.since is None:
        return registration, None
    try:
        cursor = Cursor.decode(registration.since)
    except CursorError as exc:
        await _refuse(ws, CloseCode.POLICY_VIOLATION, f"since: {exc}", remote)
        return None
    try:
        return registration, await service.resume_position(cursor)
    except BucketUnavailable:
        await _refuse(ws, CloseCode.TRY_AGAIN_LATER, UNAVAILABLE, remote)
        return None


async def _read_until_closed(ws: web.WebSocketResponse) -> str:
    """Accept heartbeats until the socket closes; returns why it closed."""
    try:
        async for message in ws:
            if message.type is WSMsgType.TEXT and message.data == HEARTBEAT:
                continue
            if message.type is WSMsgType.TEXT:
                await ws.close(
                    code=CloseCode.POLICY_VIOLATION,
                    message=b"a socket carries one registration; open another socket",
                )
                return "second registration on one socket"
            if message.type is WSMsgType.BINARY:
                await ws.close(
                    code=CloseCode.UNSUPPORTED_DATA, message=b"binary frames are not used"
                )
                return "binary frame"
            if message.type is WSMsgType.ERROR:
                return f"error: {message.data}"
    except asyncio.CancelledError:
        return "publisher shutting down"
    if ws.close_code not in (None, 1000, 1001):
        return f"closed by listener (code {ws.close_code})"
    return "closed by listener"
