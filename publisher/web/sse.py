"""`GET /changefeeds/sse`: the change feed as server-sent events, for browsers and `curl -N`.

The query is a registration: `resource`, repeated `sub` (sub-resources, `*` for all), repeated
`id` and `prefix` (a watch), `since` (or the `Last-Event-ID` header, which wins: what a browser's
EventSource sends when it reconnects), and optionally `instance` and `service` (how
/changefeeds/stats names it). It is checked as a websocket registration is (the same parser, the
same `listen:<resource>` scope, registration rate and listener cap in publisher.web.access), then
the stream is one more subscriber of the hub: the same window, catch-up and slow-consumer closing,
only with `change_chunk`s instead of websocket frames (changefeed.sse). docs/sse.md documents it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import orjson
import structlog
from aiohttp import web

from changefeed import sse
from changefeed.errors import ParamError, RegistrationError
from changefeed.longpoll import QUERY_NAMES, filter_of
from changefeed.protocol import CloseCode, Registration, Resource, registration_reply
from publisher.delivery.hub import Subscriber
from publisher.security.auth import Identity
from publisher.security.clientaddr import client_address
from publisher.web.access import CORS, LISTEN, identity_of, requires
from publisher.web.app_keys import ACCESS, HUB, LIVE, TAIL
from publisher.web.http import json_error
from publisher.web.query import takes
from publisher.web.registrations import (
    BY_ACCESS,
    START_ERRORS,
    Admitted,
    Refused,
    check,
    refusal_of,
    started,
)

log = structlog.get_logger(__name__)

SSE_ROUTE = "/changefeeds/sse"


def registration_of(
    query: dict[str, list[str]], remote: str, identity: str, resources: Mapping[str, Resource]
) -> bytes:
    """The query as the v2 registration frame it stands for (parse_registration checks it
    again); RegistrationError names the query parameter that is wrong."""
    _check_filter(query, resources)
    kind: dict[str, object] = {"resource": query["resource"][0], "subResources": query["sub"]}
    if query.get("id"):
        kind["ids"] = query["id"]
    if query.get("prefix"):
        kind["prefixes"] = query["prefix"]
    if query.get("instance") == [""]:
        raise RegistrationError(CloseCode.POLICY_VIOLATION,
                                "instance: must not be empty (or leave it out)")
    frame: dict[str, object] = {
        "instance": (query.get("instance") or [f"sse:{identity}@{remote}"])[0],
        "service": (query.get("service") or ["sse"])[0],
        "resources": [kind],
    }
    if query.get("since"):
        frame["since"] = query["since"][0]
    return orjson.dumps(frame)


def _check_filter(query: dict[str, list[str]], resources: Mapping[str, Resource]) -> None:
    """Refuse the query's `resource`, `sub`, `id` and `prefix` as the query names them."""
    def refuse(reason: str) -> RegistrationError:
        return RegistrationError(CloseCode.POLICY_VIOLATION, reason)

    named = query.get("resource", [""])[0]
    if not named:
        raise refuse(f"resource: name the resource to listen to (known: "
                     f"{', '.join(sorted(resources)) or 'none'})")
    subs = query.get("sub", [])
    if named in resources and not subs:
        example = resources[named].sub_resources[0]
        raise refuse(f"sub: at least one sub-resource is required (sub={example}, or sub=* for "
                     "all)")
    try:
        filter_of(named, subs, query.get("id"), query.get("prefix"), resources, QUERY_NAMES)
    except ParamError as exc:
        raise refuse(str(exc)) from None


@takes("resource", "since", "instance", "service", "access_token",
       repeated=("sub", "id", "prefix"))
@requires(LISTEN)
async def handle_sse(request: web.Request) -> web.StreamResponse:
    """GET /changefeeds/sse: admit the registration (`_admitted`), open the stream (`_open`),
    add the subscriber to the hub after its first event (`_start`), then keep it alive until it
    ends (`_keep_alive`)."""
    app = request.app
    config = app[LIVE].config
    send_buffer = config.limits.send_buffer
    hub = app[HUB]
    remote = client_address(request, config.server.trusted_proxies)
    identity = identity_of(request)
    admitted = await _admitted(request, remote, identity)
    if isinstance(admitted, web.Response):
        return admitted
    response = await _open(request)
    transport = request.transport
    if transport is None or transport.is_closing():
        return response
    registration = admitted.registration
    conn = _start(request, admitted, identity, remote, send_buffer)
    bound = _bound(registration, remote)
    bound.info("sse listener registered", resumed=admitted.resumed,
               listeners=len(hub.connections))
    try:
        await _keep_alive(app, conn, send_buffer)
    finally:
        hub.remove(conn)
        hub.counters.sse_end("publisher" if conn.closing else "listener")
        bound.info("sse listener disconnected", listeners=len(hub.connections),
                   reason="closed by publisher" if conn.closing else "closed by listener")
    return response


async def _admitted(
    request: web.Request, remote: str, identity: Identity
) -> Admitted | web.Response:
    """The query's registration admitted (publisher.web.registrations: the registration,
    scopes and client limits, the tail's health, where it starts), after the checks of SSE's
    own (parameters, HTTP version); else the error response refusing it."""
    app = request.app
    if request.version < (1, 1):
        return json_error(400, "HttpVersion", "server-sent events need HTTP/1.1")
    query = {key: request.query.getall(key) for key in set(request.query)}
    last_id = request.headers.get("Last-Event-ID")
    if last_id:
        query["since"] = [last_id]
    hub, access = app[HUB], app[ACCESS]
    listeners = len(hub.connections)
    try:
        frame = registration_of(query, remote, identity.name, app[LIVE].config.resource_map)
    except RegistrationError as exc:
        return _refuse(refusal_of(exc), remote)
    checked = check(
        frame, 2, app[LIVE].config.resource_map,
        lambda registration: access.registration_refusal(
            identity, registration, remote, listeners
        ),
        app[TAIL].healthy,
    )
    if isinstance(checked, Refused):
        return _refuse(checked, remote)
    try:
        outcome = started(checked, await hub.start_of(checked.since))
    except START_ERRORS as exc:
        outcome = started(checked, exc)
    return _refuse(outcome, remote) if isinstance(outcome, Refused) else outcome


def _refuse(refusal: Refused, remote: str) -> web.Response:
    """The HTTP answer of `refusal` (publisher.web.registrations), logged unless the access
    checks logged it already."""
    if refusal.why not in BY_ACCESS:
        log.info("sse registration refused", status=refusal.http_status, code=refusal.code,
                 reason=refusal.reason, remote=remote)
    return json_error(refusal.http_status, refusal.code, refusal.reason, refusal.headers())


async def _open(request: web.Request) -> web.StreamResponse:
    """The event stream's response, its headers sent."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                 "X-Accel-Buffering": "no", **request.get(CORS, {})}
    )
    response.enable_chunked_encoding()
    await response.prepare(request)
    return response


def _start(
    request: web.Request, admitted: Admitted, identity: Identity, remote: str, send_buffer: int,
) -> Subscriber:
    """Write the `registered` event (and `resync` when `since` is not resumed) and add the
    subscriber to the hub, from where it was admitted to start (the caller checked the
    transport is open)."""
    transport = request.transport
    assert transport is not None
    registration, start, resumed = admitted.registration, admitted.start, admitted.resumed
    start_cursor = start.encode()
    reply = registration_reply(registration, request.app[LIVE].config.resource_map,
                               start_cursor, resumed)
    # From here to hub.add nothing awaits: the registered event's id is where the stream starts.
    first = sse.event(sse.REGISTERED, orjson.dumps(reply), start_cursor)
    if registration.since is not None and not resumed:
        reason = f"cannot resume from {registration.since}: bootstrap again"
        first += sse.event(sse.RESYNC, orjson.dumps({"reason": reason}))
    transport.write(sse.chunk(first))
    transport.set_write_buffer_limits(high=send_buffer)
    conn = Subscriber(registration, transport, request.protocol, remote, sse=True,
                      identity=identity)
    request.app[HUB].add(conn, start)
    return conn


async def _keep_alive(app: web.Application, conn: Subscriber, send_buffer: int) -> None:
    """Ping the stream every `limits.pingInterval` (when its buffer has room) until it ends;
    once the hub has ended it, wait to be cancelled."""
    transport = conn.transport
    while not (conn.closing or transport.is_closing()):
        await asyncio.sleep(app[LIVE].config.limits.ping_interval)
        if conn.closing or transport.is_closing():
            break
        if transport.get_write_buffer_size() <= send_buffer:
            transport.write(sse.chunk(sse.PING))
    # The hub ended the stream (its close event and last chunk are written): aiohttp must
    # not write another end; the transport closes under the handler, which it cancels.
    await asyncio.Event().wait()


def _bound(registration: Registration, remote: str) -> structlog.stdlib.BoundLogger:
    bound: structlog.stdlib.BoundLogger = log.bind(
        instance=registration.instance,
        service=registration.service,
        resources=[k.resource for k in registration.kinds],
        remote=remote,
    )
    return bound


routes = [web.get(SSE_ROUTE, handle_sse)]


__all__ = ["SSE_ROUTE", "handle_sse", "registration_of", "routes"]
