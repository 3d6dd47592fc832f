"""The websocket side of /changefeeds: registration, then the hub writes to the socket (and,
without an upgrade, the description of the resources, from the same handler).

One handler task per connection reads what the listener sends (its registration, then `heartbeat`
texts, pings and pongs, each one a sign of life for the keepalive sweep of publisher.delivery.pings)
and unregisters it the moment it goes away (registrations are ephemeral, RFD 5). The handler finds
the config, hub, bucket and tail under the application's keys (`publisher.web.app_keys`).
"""

from __future__ import annotations

import asyncio

import orjson
import structlog
from aiohttp import WSMessage, WSMsgType, web

from changefeed.errors import (
    BucketBusy,
    BucketUnavailable,
    CursorError,
    EpochNotRead,
    RegistrationError,
)
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
from publisher.bucket import Vector
from publisher.config.settings import Config
from publisher.delivery.hub import Subscriber
from publisher.security.auth import Identity
from publisher.security.clientaddr import client_address
from publisher.web.access import identity_of, selected_protocols
from publisher.web.admission import PROTOCOL_ERROR, Guard
from publisher.web.app_keys import ACCESS, CONFIG, HUB, LIFECYCLE, LIVE, TAIL, Lifecycle
from publisher.web.discovery import VersionRefused, resources_body, shape_for
from publisher.web.http import (
    EPOCH_NOT_READ,
    OVERLOADED,
    UNAVAILABLE,
    bad_request,
    json_response,
)

log = structlog.get_logger(__name__)

_CLOSED = (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED)
"""What `receive()` returns once the socket is closing (where `async for` would stop)."""
NOT_REFUSED = (None, 1000, 1001, 1005, 1006)
"""Close codes of a socket that ended before registering without being refused (the listener
closed it, or the publisher is stopping)."""


def describe(config: Config, accept_version: str | None = None) -> web.Response:
    """GET /changefeeds without an upgrade: the resources served and the bucket's partitions,
    or an older shape that `Accept-Version` asks for (publisher.web.discovery)."""
    try:
        shape = shape_for(accept_version)
    except VersionRefused as exc:
        raise bad_request("BadAcceptVersion", str(exc)) from None
    return json_response(resources_body(config, shape))


async def handle_changefeeds(request: web.Request) -> web.StreamResponse:
    """GET /changefeeds: a websocket upgrade registers a listener and serves it until it goes
    away; without one, `describe`. One handler for both, with no dispatcher's coroutine in
    front of the listener's for the life of its connection: the steps before its read loop
    (`_version_of`, `_upgrade`, `_registered`, `_start`) return before it begins."""
    app = request.app
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return describe(app[CONFIG], request.headers.get("Accept-Version"))
    limits = app[LIVE].config.limits
    lifecycle = app[LIFECYCLE]
    version = _version_of(request)
    ws, guard = await _upgrade(request, limits.registration_bytes)
    remote = client_address(request, app[CONFIG].server.trusted_proxies)
    registered = await _registered(request, ws, version, remote, guard)
    if registered is None:
        return ws
    conn = _start(request, *registered, remote, limits.send_buffer)
    # Nothing of the registration's is needed again that the connection does not hold itself,
    # and this frame lives as long as the connection.
    del registered
    if conn is None:
        return ws
    hub = app[HUB]
    shed_request(request)
    reason = "closed by publisher"
    try:
        reason = await _read_until_closed(ws, conn)
    except asyncio.CancelledError:
        # aiohttp cancels the handler when the connection is lost (handler_cancellation).
        reason = _why_cancelled(ws, lifecycle, guard)
        raise
    finally:
        hub.remove(conn)
        if conn.closing:
            reason = "closed by publisher"
        log.info("listener disconnected", **_context(conn), reason=reason,
                 listeners=len(hub.connections))
    return ws


def _version_of(request: web.Request) -> int:
    """The protocol version the upgrade accepts (400 BadAcceptVersion for one it cannot)."""
    try:
        # A browser cannot set headers on an upgrade: ?accept_version=~2 stands for the header.
        return accept_version(
            request.headers.get("Accept-Version") or request.query.get("accept_version")
        )
    except RegistrationError as exc:
        raise bad_request("BadAcceptVersion", exc.reason) from None


async def _upgrade(
    request: web.Request, registration_bytes: int
) -> tuple[web.WebSocketResponse, Guard | None]:
    """The websocket, prepared (the upgrade answered), and the admission guard of its
    connection, told to expect frames from now on."""
    # No heartbeat of aiohttp's (a timer per connection): publisher.delivery.pings sweeps every
    # listener from one task, and the read loop answers pings and sees pongs (autoping off).
    ws = web.WebSocketResponse(
        protocols=selected_protocols(request),
        autoping=False,
        max_msg_size=registration_bytes,
        compress=False,
        timeout=5.0,
    )
    guard = _guard_of(request)
    if guard is not None:
        guard.expect_frames()  # from the upgrade on, what the client sends are frames
    try:
        await ws.prepare(request)
    except BaseException:
        if guard is not None:
            guard.expect_requests()
        raise
    return ws, guard


async def _registered(
    request: web.Request, ws: web.WebSocketResponse, version: int, remote: str,
    guard: Guard | None,
) -> tuple[Registration, Vector, bool, Identity] | None:
    """`_register` while the socket counts as unregistered (for the shutdown), with the
    identity it registers as; None when it was refused (counted by close code for metrics) or
    ended before registering."""
    lifecycle = request.app[LIFECYCLE]
    lifecycle.unregistered.add(ws)
    try:
        identity = identity_of(request)
        registered = await _register(ws, version, request.app, remote, identity)
    except asyncio.CancelledError:
        if guard is not None and guard.violation is not None:
            lifecycle.refused[PROTOCOL_ERROR] += 1
            log.info("registration refused", code=PROTOCOL_ERROR, reason=guard.violation,
                     remote=remote)
        raise
    finally:
        lifecycle.unregistered.discard(ws)
    if registered is None:
        if ws.close_code not in NOT_REFUSED:
            lifecycle.refused[ws.close_code] += 1  # for metrics, by code
        return None
    return (*registered, identity)


def _start(
    request: web.Request, registration: Registration, start: Vector, resumed: bool,
    identity: Identity, remote: str, send_buffer: int,
) -> Subscriber | None:
    """Write the registration's reply and add the listener to the hub, from `start`; None when
    the connection is gone already."""
    transport = request.transport
    if transport is None or transport.is_closing():
        return None
    app = request.app
    hub = app[HUB]
    # From here to hub.add nothing awaits: the reply's cursor is exactly where the stream starts.
    # (The frame is not kept in a local: the handler's lives as long as the connection.)
    transport.write(text_frame(orjson.dumps(registration_reply(
        registration, app[CONFIG].resource_map, start.encode(), resumed
    ))))
    # The protocol pauses (and drains) above the send buffer: what the hub counts as slow.
    transport.set_write_buffer_limits(high=send_buffer)
    conn = Subscriber(registration, transport, request.protocol, remote, identity=identity)
    hub.add(conn, start)
    log.info(
        "listener registered",
        **_context(conn),
        version=registration.version,
        resumed=resumed,
        listeners=len(hub.connections),
    )
    return conn


def _context(conn: Subscriber) -> dict[str, object]:
    """What every log line of a registered listener says about it (built when logging rather
    than bound once: a bound logger per idle connection costs memory all its life)."""
    registration = conn.registration
    return {"instance": registration.instance, "service": registration.service,
            "resources": [k.resource for k in registration.kinds], "remote": conn.remote}


def shed_request(request: web.Request) -> None:
    """Drop what aiohttp keeps of an upgraded request that nothing reads again, for as long as
    the listener stays: its HTTP/1.1 parser (from the upgrade on, the bytes go to the websocket
    reader; aiohttp only consults the parser again when an upgrade was declined) and the
    cached properties of the request (url, host, remote...: computed again if asked).
    Measured with `python -m bench.heap` (docs/benchmarks.md, P5)."""
    protocol = request.protocol
    if getattr(protocol, "_payload_parser", None) is not None and hasattr(protocol, "_parser"):
        protocol._parser = None
    cache = getattr(request, "_cache", None)
    if isinstance(cache, dict):
        cache.clear()


def _guard_of(request: web.Request) -> Guard | None:
    """The admission guard of the request's connection (None in a test server without one)."""
    protocol = request.transport.get_protocol() if request.transport is not None else None
    return protocol if isinstance(protocol, Guard) else None


def _why_cancelled(
    ws: web.WebSocketResponse, lifecycle: Lifecycle, guard: Guard | None
) -> str:
    """Why a registered socket's handler was cancelled: the publisher is stopping, the guard
    closed it for a bad frame, aiohttp failed it, or the peer went away without a close frame
    (a socket the publisher closed itself, such as a missing pong's, is logged as that)."""
    if guard is not None and guard.violation is not None:
        return f"protocol error: {guard.violation}"
    if lifecycle.stopping.is_set():
        return "publisher shutting down"
    error = ws.exception()
    if error is not None:
        return f"error: {error}"
    return "connection lost (no close frame)"


async def _refuse(
    ws: web.WebSocketResponse, code: int, reason: str, remote: str, logged: bool = False
) -> None:
    if not logged:
        log.info("registration refused", code=code, reason=reason, remote=remote)
    await ws.close(code=code, message=close_reason(reason).encode())


async def _register(
    ws: web.WebSocketResponse, version: int, app: web.Application, remote: str,
    identity: Identity,
) -> tuple[Registration, Vector, bool] | None:
    """Read and check the registration: with where its stream starts and whether that resumes
    its `since`; None when the socket was refused (and closed)."""
    timeout = app[LIVE].config.limits.registration_timeout
    try:
        message = await _first_frame(ws, timeout)
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
    if message.type in _CLOSED:
        return None
    if message.type is not WSMsgType.TEXT:
        await _refuse(ws, CloseCode.UNSUPPORTED_DATA, "registration must be a text frame", remote)
        return None
    try:
        registration = parse_registration(message.data, version, app[CONFIG].resource_map)
    except RegistrationError as exc:
        await _refuse(ws, exc.close_code, exc.reason, remote)
        return None
    refusal = app[ACCESS].registration_refusal(
        identity, registration, remote, len(app[HUB].connections)
    )
    if refusal is not None:  # scopes and client limits (publisher.web.access), logged there
        await _refuse(ws, *refusal, remote, logged=True)
        return None
    if not app[TAIL].healthy:
        await _refuse(ws, CloseCode.TRY_AGAIN_LATER, UNAVAILABLE, remote)
        return None
    try:
        return registration, *await app[HUB].start_of(registration.since)
    except CursorError as exc:
        await _refuse(ws, CloseCode.POLICY_VIOLATION, f"since: {exc}", remote)
        return None
    except BucketBusy:
        await _refuse(ws, CloseCode.OVERLOADED, OVERLOADED, remote)
        return None
    except EpochNotRead:
        await _refuse(ws, CloseCode.TRY_AGAIN_LATER, EPOCH_NOT_READ, remote)
        return None
    except BucketUnavailable:
        await _refuse(ws, CloseCode.TRY_AGAIN_LATER, UNAVAILABLE, remote)
        return None


async def _first_frame(ws: web.WebSocketResponse, timeout: float) -> WSMessage:
    """The first message that is not a ping or a pong (pings answered), within `timeout`
    seconds (else TimeoutError)."""
    async with asyncio.timeout(timeout):
        while True:
            message = await ws.receive()
            if message.type is WSMsgType.PING:
                await ws.pong(message.data)
            elif message.type is not WSMsgType.PONG:
                return message


async def _read_until_closed(ws: web.WebSocketResponse, conn: Subscriber) -> str:
    """Accept heartbeats, pings and pongs until the socket closes; returns why it closed.
    Whatever arrives tells the keepalive sweep (publisher.delivery.pings) that the listener is
    alive.
    (`receive()` rather than `async for`: the iterator's coroutine would be one more frame held
    for the life of every connection.)"""
    while True:
        message = await ws.receive()
        if message.type in _CLOSED:
            break
        conn.heard()
        if message.type is WSMsgType.PONG:
            continue
        if message.type is WSMsgType.PING:
            await ws.pong(message.data)
            continue
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
    if ws.close_code not in (None, 1000, 1001):
        return f"closed by listener (code {ws.close_code})"
    return "closed by listener"
