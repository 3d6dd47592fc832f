"""The pull routes: `GET /changefeeds/events`, the JSON-RPC 2.0 endpoint `POST /changefeeds/rpc`
(method `events`) and the ZeroEventHub feed `GET /changefeeds/feed/v1`.

Plain HTTP errors are `{"code", "message"}` bodies with a 4xx status (503 when Redis is down,
through the app's middleware). JSON-RPC errors are JSON-RPC error objects, with the HTTP status
that JSON-RPC over HTTP gives them (400 for a bad request or params, 404 for an unknown method).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
import structlog
from aiohttp import web

from changefeed import feed, longpoll
from changefeed.errors import BucketUnavailable, CursorGone, ParamError
from publisher import polls
from publisher.routes import json_error, json_response

if TYPE_CHECKING:
    from publisher.service import Service

log = structlog.get_logger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
SERVER_ERROR = -32000  # the change bucket is unavailable: retry later


def rpc_error(id: Any, code: int, message: str, status: int) -> web.Response:
    body = {"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}
    return json_response(body, status)


def add_poll_routes(app: web.Application, service: Service) -> None:
    config = service.config
    resources = service.resources

    async def events_get(request: web.Request) -> web.Response:
        try:
            query = longpoll.from_query(
                request.query, lambda name: request.query.getall(name, []), resources, config.limits
            )
        except ParamError as exc:
            return json_error(400, "InvalidParameter", str(exc))
        reply = await polls.answer(service.bucket, service.hub, query)
        return json_response(reply.to_wire())

    async def rpc(request: web.Request) -> web.Response:
        try:
            call = orjson.loads(await request.read())
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
        if method != "events":
            return rpc_error(id, METHOD_NOT_FOUND, f"method {method!r} not found (events)", 404)
        try:
            query = longpoll.from_params(call.get("params"), resources, config.limits)
        except ParamError as exc:
            return rpc_error(id, INVALID_PARAMS, f"invalid params: {exc}", 400)
        try:
            reply = await polls.answer(service.bucket, service.hub, query)
        except BucketUnavailable as exc:
            log.warning("rpc failed: bucket unavailable", error=str(exc))
            return rpc_error(id, SERVER_ERROR, "change bucket unavailable, try again later", 503)
        if "id" not in call:
            return web.Response(status=204)  # a notification: no reply
        return json_response({"jsonrpc": "2.0", "id": id, "result": reply.to_wire()})

    async def feed_get(request: web.Request) -> web.Response:
        try:
            query = feed.parse_request(
                request.query, lambda name: request.query.getall(name, []), config.limits
            )
            partitions = await service.bucket.partition_count()
            lines = await polls.respond_feed(service.bucket, service.hub, query, partitions)
        except ParamError as exc:
            return json_error(400, "InvalidParameter", str(exc))
        except CursorGone as exc:
            return json_error(410, "CursorGone", str(exc))
        return web.Response(body=b"".join(lines), content_type="application/x-ndjson")

    app.router.add_get("/changefeeds/events", events_get)
    app.router.add_post("/changefeeds/rpc", rpc)
    app.router.add_get("/changefeeds/feed/v1", feed_get)
