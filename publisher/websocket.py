"""The websocket side of /changefeeds: registration, then the hub writes to the socket.

One handler task per connection reads what the listener sends (its registration, then `heartbeat`
texts, pongs) and unregisters it the moment it goes away (registrations are ephemeral, RFD 5).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog
from aiohttp import WSMsgType, web

from publisher.cursor import Cursor, StreamId
from publisher.errors import BucketUnavailable, CursorError, RegistrationError
from publisher.hub import Connection
from publisher.protocol import (
    HEARTBEAT,
    CloseCode,
    accept_version,
    close_reason,
    parse_registration,
    registration_reply,
    text_frame,
)

if TYPE_CHECKING:
    from publisher.service import Service

import orjson

log = structlog.get_logger(__name__)


async def _refuse(ws: web.WebSocketResponse, code: int, reason: str, **context: object) -> None:
    log.info("registration refused", code=code, reason=reason, **context)
    await ws.close(code=code, message=close_reason(reason).encode())


async def handle_websocket(request: web.Request, service: Service) -> web.WebSocketResponse:
    limits = service.config.limits
    remote = f"{request.remote}"
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
    try:
        message = await ws.receive(timeout=limits.registration_timeout)
    except TimeoutError:
        await _refuse(
            ws,
            CloseCode.POLICY_VIOLATION,
            f"no registration within {limits.registration_timeout:g} s",
            remote=remote,
        )
        return ws
    if message.type is WSMsgType.ERROR:
        log.info(
            "registration refused", remote=remote, code=ws.close_code, reason=str(message.data)
        )
        return ws
    if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
        return ws
    if message.type is not WSMsgType.TEXT:
        await _refuse(
            ws, CloseCode.UNSUPPORTED_DATA, "registration must be a text frame", remote=remote
        )
        return ws
    try:
        registration = parse_registration(message.data, version, service.resources)
    except RegistrationError as exc:
        await _refuse(ws, exc.close_code, exc.reason, remote=remote)
        return ws

    bound = log.bind(
        instance=registration.instance,
        service=registration.service,
        resources=[k.resource for k in registration.kinds],
        remote=remote,
    )
    hub = service.hub
    if not service.tail.healthy:
        await _refuse(
            ws,
            CloseCode.TRY_AGAIN_LATER,
            "change bucket unavailable, try again later",
            remote=remote,
        )
        return ws

    since: StreamId | None = None
    if registration.since is not None:
        try:
            cursor = Cursor.decode(registration.since)
        except CursorError as exc:
            await _refuse(ws, CloseCode.POLICY_VIOLATION, f"since: {exc}", remote=remote)
            return ws
        try:
            since = await service.resume_position(cursor)
        except BucketUnavailable:
            await _refuse(
                ws,
                CloseCode.TRY_AGAIN_LATER,
                "change bucket unavailable, try again later",
                remote=remote,
            )
            return ws

    transport = request.transport
    if transport is None or transport.is_closing():
        return ws
    # From here to hub.add nothing awaits: the reply's cursor is exactly where the stream starts.
    head = hub.window.head
    start = since if since is not None else head
    reply = registration_reply(
        registration,
        service.resources,
        Cursor(hub.epoch, head).encode(),
        resumed=since is not None,
    )
    transport.write(text_frame(orjson.dumps(reply)))
    # The protocol pauses (and drains) above the send buffer: what the hub counts as slow.
    transport.set_write_buffer_limits(high=limits.send_buffer)
    conn = Connection(registration, ws, transport, request.protocol, remote)
    hub.add(conn, start)
    bound.info(
        "listener registered",
        version=registration.version,
        resumed=since is not None,
        listeners=len(hub.connections),
    )
    reason = "closed by listener"
    try:
        async for message in ws:
            if message.type is WSMsgType.TEXT and message.data == HEARTBEAT:
                continue
            if message.type is WSMsgType.TEXT:
                reason = "second registration on one socket"
                await ws.close(
                    code=CloseCode.POLICY_VIOLATION,
                    message=b"a socket carries one registration; open another socket",
                )
                break
            if message.type is WSMsgType.BINARY:
                reason = "binary frame"
                await ws.close(
                    code=CloseCode.UNSUPPORTED_DATA, message=b"binary frames are not used"
                )
                break
            if message.type is WSMsgType.ERROR:
                reason = f"error: {message.data}"
                break
    except asyncio.CancelledError:
        reason = "publisher shutting down"
        raise
    finally:
        if conn.closing:
            reason = "closed by publisher"
        elif ws.close_code is not None and ws.close_code not in (1000, 1001):
            reason = f"{reason} (code {ws.close_code})"
        hub.remove(conn)
        bound.info("listener disconnected", reason=reason, listeners=len(hub.connections))
    return ws
