"""The websocket side of /changefeeds: registration, then the hub writes to the socket (and,
without an upgrade, the description of the resources, from the same handler).

One handler task per connection reads what the listener sends (its registration, then `heartbeat`
texts, pings and pongs, each one a sign of life for the keepalive sweep of publisher.delivery.pings)
and unregisters it the moment it goes away (registrations are ephemeral, RFD 5). The handler finds
the config, hub, bucket and tail under the application's keys (`publisher.web.app_keys`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii

import orjson
import structlog
from aiohttp import WSMessage, WSMsgType, web
from aiohttp.http_websocket import WebSocketError

from changefeed.errors import RegistrationError
from changefeed.protocol import (
    CHANGEFEEDS,
    HEARTBEAT,
    CloseCode,
    accept_version,
    close_reason,
    registration_reply,
    text_frame,
)
from publisher.config.settings import Config
from publisher.delivery.hub import Subscriber
from publisher.security.auth import Identity
from publisher.security.clientaddr import client_address
from publisher.web.access import identity_of, selected_protocols
from publisher.web.admission import Guard
from publisher.web.app_keys import ACCESS, HUB, LIFECYCLE, LIVE, TAIL, Lifecycle
from publisher.web.discovery import VersionRefused, resources_body, shape_for
from publisher.web.http import bad_request, json_response
from publisher.web.query import takes
from publisher.web.registrations import (
    BY_ACCESS,
    START_ERRORS,
    Admitted,
    Refused,
    Why,
    check,
    refused,
    started,
)

log = structlog.get_logger(__name__)

_CLOSED = (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED)
"""What `receive()` returns once the socket is closing (where `async for` would stop)."""
UPGRADED = web.RequestKey("upgraded", web.WebSocketResponse)
"""The websocket of an upgraded request whose handler was cancelled (its connection lost): for
the middleware to count it as the 101 it was (publisher.web.edge). Set only then: a key in the
request's state costs every idle listener a dict's table."""


def describe(config: Config, accept_version: str | None = None) -> web.Response:
    """GET /changefeeds without an upgrade: the resources served and the bucket's partitions,
    or an older shape that `Accept-Version` asks for (publisher.web.discovery)."""
    try:
        shape = shape_for(accept_version, config.discovery.default_version)
    except VersionRefused as exc:
        raise bad_request("BadAcceptVersion", str(exc)) from None
    return json_response(resources_body(config, shape))


@takes("accept_version", "access_token")
async def handle_changefeeds(request: web.Request) -> web.StreamResponse:
    """GET /changefeeds: a websocket upgrade registers a listener and serves it until it goes
    away; without one, `describe`. One handler for both, with no dispatcher's coroutine in
    front of the listener's for the life of its connection: the steps before its read loop
    (`_version_of`, `_upgrade`, `_registered`, `_start`) return before it begins."""
    app = request.app
    config = app[LIVE].config
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return describe(config, request.headers.get("Accept-Version"))
    limits = config.limits
    lifecycle = app[LIFECYCLE]
    version = _version_of(request)
    ws, guard = await _upgrade(request, limits.registration_bytes)
    remote = client_address(request, config.server.trusted_proxies)
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
    reason, code = "closed by publisher", ws.close_code
    try:
        reason, code = await _read_until_closed(ws, conn)
    except asyncio.CancelledError:
        # aiohttp cancels the handler when the connection is lost (handler_cancellation).
        reason, code = _why_cancelled(ws, lifecycle, guard)
        if code == CloseCode.ABNORMAL_CLOSURE:
            lifecycle.count_abnormal_closure()
        request[UPGRADED] = ws
        raise
    finally:
        hub.remove(conn)
        if conn.closing:
            reason = "closed by publisher"
        log.info("listener disconnected", **_context(conn), reason=reason,
                 code=None if code is None else int(code),
                 listeners=len(hub.connections))
    return ws


routes = [web.get(CHANGEFEEDS, handle_changefeeds)]
"""GET /changefeeds, plain (the resources) or an upgrade (a listener): one handler, so that a
listener's connection holds no coroutine frame of a dispatcher in front of it."""


def key_problem(key: str | None) -> str | None:
    """What is wrong with an upgrade's `Sec-WebSocket-Key` (RFC 6455 4.1: the base64 of 16
    bytes), None when nothing is (pure)."""
    if key is None:
        return "the websocket upgrade lacks the Sec-WebSocket-Key header (RFC 6455 4.1)"
    try:
        if len(base64.b64decode(key, validate=True)) == 16:
            return None
    except binascii.Error:
        pass
    return f"Sec-WebSocket-Key {key[:40]!r} is not the base64 of 16 bytes (RFC 6455 4.1)"


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
    connection, told to expect frames from now on (400 InvalidHandshake without a valid
    `Sec-WebSocket-Key`)."""
    wrong = key_problem(request.headers.get("Sec-WebSocket-Key"))
    if wrong is not None:
        raise bad_request("InvalidHandshake", wrong)
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
) -> tuple[Admitted, Identity] | None:
    """`_register` while the socket counts as unregistered (for the shutdown), with the
    identity it registers as; None when it was refused (counted by close code for metrics) or
    ended before registering."""
    lifecycle = request.app[LIFECYCLE]
    lifecycle.unregistered.add(ws)
    try:
        identity = identity_of(request)
        admitted = await _register(ws, version, request.app, remote, identity)
    except asyncio.CancelledError:
        if guard is not None and guard.violation is not None:
            _refused_frame(lifecycle, CloseCode.PROTOCOL_ERROR, guard.violation, remote)
        elif not lifecycle.stopping.is_set():
            lifecycle.count_abnormal_closure()
        request[UPGRADED] = ws
        raise
    finally:
        lifecycle.unregistered.discard(ws)
    if admitted is None:
        return None
    return admitted, identity


def _start(
    request: web.Request, admitted: Admitted, identity: Identity, remote: str, send_buffer: int,
) -> Subscriber | None:
    """Write the registration's reply and add the listener to the hub, from where it was
    admitted to start; None when the connection is gone already."""
    transport = request.transport
    if transport is None or transport.is_closing():
        return None
    app = request.app
    hub = app[HUB]
    registration, start, resumed = admitted.registration, admitted.start, admitted.resumed
    # From here to hub.add nothing awaits: the reply's cursor is exactly where the stream starts.
    # (The frame is not kept in a local: the handler's lives as long as the connection.)
    transport.write(text_frame(orjson.dumps(registration_reply(
        registration, app[LIVE].config.resource_map, start.encode(), resumed
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
    Measured with `python -m bench.studies.heap` (docs/benchmarks.md, P5)."""
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
) -> tuple[str, int | None]:
    """Why a registered socket's handler was cancelled: the publisher is stopping, the guard
    closed it for a bad frame, aiohttp failed it, or the peer went away without a close frame
    (a socket the publisher closed itself, such as a missing pong's, is logged as that)."""
    if guard is not None and guard.violation is not None:
        return f"protocol error: {guard.violation}", CloseCode.PROTOCOL_ERROR
    if lifecycle.stopping.is_set():
        return "publisher shutting down", CloseCode.GOING_AWAY
    error = ws.exception()
    if error is not None:
        return f"error: {error}", None if ws.close_code is None else int(ws.close_code)
    return "connection lost (no close frame)", CloseCode.ABNORMAL_CLOSURE


async def _refuse(
    ws: web.WebSocketResponse, refusal: Refused, remote: str, lifecycle: Lifecycle
) -> None:
    """Close `ws` as `refusal` says (publisher.web.registrations), logged (unless the access
    checks logged it already) and counted by close code."""
    code = refusal.close_code
    lifecycle.count_refused(code)
    if refusal.why not in BY_ACCESS:
        log.info("registration refused", code=int(code), reason=refusal.reason, remote=remote)
    await ws.close(code=code, message=close_reason(refusal.reason).encode())


def _refused_frame(lifecycle: Lifecycle, code: int, reason: str, remote: str) -> None:
    """Log and count a registration refused for its frame by aiohttp or the guard, which closed
    the socket themselves, with `code`."""
    lifecycle.count_refused(code)
    log.info("registration refused", code=int(code), reason=reason, remote=remote)


def sent_code(error: object, ws: web.WebSocketResponse) -> int | None:
    """The close code aiohttp sent for a frame it refused (`WSMsgType.ERROR`): its error's,
    not the socket's `close_code`, which becomes the listener's answer (or 1006 when it gave
    none)."""
    code = error.code if isinstance(error, WebSocketError) else ws.close_code
    return None if code is None else int(code)


async def _register(
    ws: web.WebSocketResponse, version: int, app: web.Application, remote: str,
    identity: Identity,
) -> Admitted | None:
    """Read the registration and carry out its admission (publisher.web.registrations): where
    its stream starts and whether that resumes its `since`; None when the socket was refused
    (and closed) or closed before registering."""
    config, lifecycle, hub = app[LIVE].config, app[LIFECYCLE], app[HUB]
    timeout = config.limits.registration_timeout
    try:
        message = await _first_frame(ws, timeout)
    except TimeoutError:
        why = refused(Why.NO_REGISTRATION, f"no registration within {timeout:g} s")
        await _refuse(ws, why, remote, lifecycle)
        return None
    if message.type is WSMsgType.ERROR:
        # aiohttp has closed it already (1009 for an oversized frame, 1007 for one not UTF-8).
        code = sent_code(message.data, ws)
        if code is not None:
            _refused_frame(lifecycle, code, str(message.data), remote)
        return None
    if message.type in _CLOSED:
        return None
    if message.type is not WSMsgType.TEXT:
        await _refuse(ws, refused(Why.NOT_TEXT), remote, lifecycle)
        return None
    access, listeners = app[ACCESS], len(hub.connections)
    checked = check(
        message.data, version, config.resource_map,
        lambda registration: access.registration_refusal(
            identity, registration, remote, listeners
        ),
        app[TAIL].healthy,
    )
    if isinstance(checked, Refused):
        await _refuse(ws, checked, remote, lifecycle)
        return None
    try:
        outcome = started(checked, await hub.start_of(checked.since))
    except START_ERRORS as exc:
        outcome = started(checked, exc)
    if isinstance(outcome, Refused):
        await _refuse(ws, outcome, remote, lifecycle)
        return None
    return outcome


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


async def _read_until_closed(ws: web.WebSocketResponse, conn: Subscriber) -> tuple[str, int | None]:
    """Accept heartbeats, pings and pongs until the socket closes; returns why it closed and
    its close code (the one sent, when the publisher or aiohttp closed it for a frame).
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
            return "second registration on one socket", CloseCode.POLICY_VIOLATION
        if message.type is WSMsgType.BINARY:
            await ws.close(
                code=CloseCode.UNSUPPORTED_DATA, message=b"binary frames are not used"
            )
            return "binary frame", CloseCode.UNSUPPORTED_DATA
        if message.type is WSMsgType.ERROR:
            return f"frame refused: {message.data}", sent_code(message.data, ws)
    code = None if ws.close_code is None else int(ws.close_code)
    if code not in (None, CloseCode.NORMAL, CloseCode.GOING_AWAY):
        return f"closed by listener (code {code})", code
    return "closed by listener", code
