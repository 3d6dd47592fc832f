"""The pull routes: `GET /changefeeds/events`, the JSON-RPC 2.0 endpoint `POST /changefeeds/rpc`
(method `events`) and the ZeroEventHub feed `GET /changefeeds/feed/v1`.

Plain HTTP errors are `{"code", "message"}` bodies with a 4xx status (503 when Redis is down,
through the app's middleware). JSON-RPC errors are JSON-RPC error objects, with the HTTP status
that JSON-RPC over HTTP gives them (400 for a bad request or params, 404 for an unknown method).
"""

from __future__ import annotations

from typing import Any

import orjson
import structlog
from aiohttp import web

from changefeed import feed, longpoll
from changefeed.errors import (
    BucketBusy,
    BucketUnavailable,
    CursorGone,
    CursorSetsFull,
    ParamError,
)
from publisher.config.logs import Throttle
from publisher.pull import polls
from publisher.security.clientaddr import client_address
from publisher.web.access import identity_of
from publisher.web.app_keys import BUCKET, HUB, LIVE
from publisher.web.http import (
    json_error,
    json_response,
    overloaded,
    read_body,
    refusal_response,
)
from publisher.web.query import takes
from publisher.web.registrations import Why, refusal_of, refused

log = structlog.get_logger(__name__)
_refusals = Throttle(60.0)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
SERVER_ERROR = -32000  # the change bucket is unavailable: retry later


def rpc_error(
    id: Any, code: int, message: str, status: int, headers: dict[str, str] | None = None
) -> web.Response:
    body = {"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}
    return json_response(body, status, headers)


@takes(*longpoll.QUERY_SINGLE, repeated=longpoll.QUERY_REPEATED, code="InvalidParameter")
async def events_get(request: web.Request) -> web.Response:
    """`GET /changefeeds/events`: a long poll of the log, its query in the URL."""
    try:
        query = longpoll.from_query(
            request.query, lambda name: request.query.getall(name, []),
            request.app[LIVE].config.resource_map, request.app[LIVE].config.limits,
        )
    except ParamError as exc:
        return json_error(400, "InvalidParameter", str(exc))
    try:
        reply = await polls.answer(request.app[BUCKET], request.app[HUB], query)
    except ParamError as exc:  # what this bucket cannot answer (a cluster's `before`)
        return json_error(400, "InvalidParameter", str(exc))
    return json_response(reply.to_wire())


def _events_call(body: bytes) -> tuple[Any, Any] | web.Response:
    """The (id, params) of a JSON-RPC call of `events`, or its answer: an error, or 204 for a
    notification."""
    try:
        call = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return rpc_error(None, PARSE_ERROR, f"parse error: {exc}", 400)
    if isinstance(call, list):
        return rpc_error(None, INVALID_REQUEST, "batch requests are not supported", 400)
    if not isinstance(call, dict):
        return rpc_error(None, INVALID_REQUEST, "a request must be a JSON object", 400)
    id = call.get("id")
    if call.get("jsonrpc") != "2.0":
        return rpc_error(id, INVALID_REQUEST, 'jsonrpc must be "2.0"', 400)
    if isinstance(id, bool) or not isinstance(id, str | int | float | None):
        return rpc_error(None, INVALID_REQUEST, "id must be a string, a number or null", 400)
    method = call.get("method")
    if not isinstance(method, str):
        return rpc_error(id, INVALID_REQUEST, "method must be a string", 400)
    if "id" not in call:
        # A notification: its reply is never seen and `events` changes nothing, so it is
        # answered at once, without running it (or holding the connection for a long poll).
        return web.Response(status=204)
    if method != "events":
        return rpc_error(id, METHOD_NOT_FOUND, f"method {method!r} not found (events)", 404)
    return id, call.get("params")


@takes(answer=lambda message: rpc_error(None, INVALID_REQUEST, message, 400))
async def rpc(request: web.Request) -> web.Response:
    """`POST /changefeeds/rpc`: JSON-RPC 2.0, method `events` (the long poll's params)."""
    body = await read_body(request, request.app[LIVE].config.server.body_timeout)
    if isinstance(body, web.Response):
        return body
    call = _events_call(body)
    if isinstance(call, web.Response):
        return call
    id, params = call
    try:
        config = request.app[LIVE].config
        query = longpoll.from_params(params, config.resource_map, config.limits)
    except ParamError as exc:
        return rpc_error(id, INVALID_PARAMS, f"invalid params: {exc}", 400)
    try:
        reply = await polls.answer(request.app[BUCKET], request.app[HUB], query)
    except ParamError as exc:
        return rpc_error(id, INVALID_PARAMS, f"invalid params: {exc}", 400)
    except BucketUnavailable as exc:
        if isinstance(exc, BucketBusy):
            overloaded(request.path, exc)
        else:
            log.warning("rpc failed: bucket unavailable", error=str(exc))
        refusal = refusal_of(exc)
        return rpc_error(id, SERVER_ERROR, refusal.reason, refusal.http_status, refusal.headers())
    return json_response({"jsonrpc": "2.0", "id": id, "result": reply.to_wire()})


@takes(*feed.PARAMETERS, numbered=("cursor",), code="InvalidParameter")
async def feed_get(request: web.Request) -> web.Response:
    """`GET /changefeeds/feed/v1`: the ZeroEventHub feed (NDJSON lines)."""
    config = request.app[LIVE].config
    try:
        query = feed.parse_request(request.query, config.limits)
    except ParamError as exc:
        return json_error(400, "InvalidParameter", str(exc))
    if query.cursorset is not None and query.consumer not in config.feed.consumers:
        return _unknown_consumer(request, query.consumer)
    if query.cursorset is not None and not identity_of(request).allows(
        f"feed:{query.consumer}"
    ):
        return _forbidden_consumer(request, query.consumer)
    try:
        bucket = request.app[BUCKET]
        partitions = await bucket.log.partition_count()
        lines = await polls.respond_feed(
            bucket, request.app[HUB], query, partitions, config.feed
        )
    except ParamError as exc:
        return json_error(400, "InvalidParameter", str(exc))
    except CursorGone as exc:
        return refusal_response(refusal_of(exc))
    except CursorSetsFull as exc:
        _refusals_log(request, "cursor sets full", consumer=exc.consumer, most=exc.most)
        return refusal_response(refusal_of(exc))
    return web.Response(body=b"".join(lines), content_type="application/x-ndjson")


routes = [
    web.get("/changefeeds/events", events_get),
    web.post("/changefeeds/rpc", rpc),
    web.get("/changefeeds/feed/v1", feed_get),
]
"""The pull routes (their handlers read `app[LIVE]`, `app[BUCKET]` and `app[HUB]`)."""


def _unknown_consumer(request: web.Request, consumer: str | None) -> web.Response:
    """403: cursors are stored and resumed only for the consumers config.js names (until
    requests carry credentials, a name is all that tells consumers apart)."""
    _refusals_log(request, "unknown consumer", consumer=consumer)
    return refusal_response(refused(
        Why.UNKNOWN_CONSUMER,
        f"consumer {consumer!r} may not store or resume cursors on this publisher: it is not "
        "one of feed.consumers in its config.js",
    ))


def _forbidden_consumer(request: web.Request, consumer: str | None) -> web.Response:
    """403: the identity may not store or resume this consumer's cursors (scope feed:<name>)."""
    identity = identity_of(request)
    _refusals_log(request, "consumer not allowed", consumer=consumer, identity=identity.name)
    return refusal_response(refused(
        Why.FORBIDDEN,
        f"identity {identity.name!r} lacks the scope feed:{consumer} to store or resume its "
        "cursors",
    ))


def _refusals_log(request: web.Request, why: str, **fields: object) -> None:
    """Log a refused feed request, at most once a minute per client address and reason."""
    remote = client_address(request, request.app[LIVE].config.server.trusted_proxies)
    suppressed = _refusals.allow(f"{remote} {why}")
    if suppressed is not None:
        log.warning("feed request refused: " + why, remote=remote, suppressed=suppressed,
                    **fields)
