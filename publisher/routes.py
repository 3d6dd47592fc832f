"""The HTTP routes: /changefeeds, /changefeeds/stats and each resource's bootstrap route.

Every error is a JSON body `{"code", "message"}` with a 4xx status (503 when Redis is down);
bad input never produces a 500. docs/http.md documents the formats.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import orjson
import structlog
from aiohttp import web

from changefeed.errors import BucketUnavailable, ChangefeedError
from changefeed.protocol import Resource
from changefeed.watch import Watch, parse_watch
from publisher.bucket import decode_marker, encode_marker
from publisher.watch_pages import page_watched
from publisher.websocket import handle_websocket

if TYPE_CHECKING:
    from publisher.service import Service

log = structlog.get_logger(__name__)


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def json_error(status: int, code: str, message: str) -> web.Response:
    return json_response({"code": code, "message": message}, status)


@web.middleware
async def errors_as_json(request: web.Request, handler: Any) -> web.StreamResponse:
    """Turn every error into a JSON body: HTTP errors keep their status, Redis outages are 503."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPException as exc:
        if exc.content_type == "application/json" or exc.status < 400:
            raise
        code = exc.reason.replace(" ", "")
        message = {
            404: f"no route {request.method} {request.path}",
            405: f"method {request.method} not allowed on {request.path}",
        }.get(exc.status, exc.text or exc.reason)
        return json_error(exc.status, code, message)
    except BucketUnavailable as exc:
        log.warning("request failed: bucket unavailable", path=request.path, error=str(exc))
        return json_error(503, "BucketUnavailable", "change bucket unavailable, try again later")
    except ChangefeedError as exc:
        log.error("request failed", path=request.path, error=str(exc))
        return json_error(500, "InternalError", str(exc))


def _limit(request: web.Request, default: int, maximum: int) -> int:
    text = request.query.get("limit")
    if text is None:
        return default
    if not text.isdigit() or not 1 <= int(text) <= maximum:
        raise web.HTTPBadRequest(
            text=orjson.dumps(
                {"code": "InvalidLimit", "message": f"limit must be an integer from 1 to {maximum}"}
            ).decode(),
            content_type="application/json",
        )
    return int(text)


def _watch(request: web.Request) -> Watch:
    """The watch of a bootstrap page: its repeated `id=` and `prefix=` parameters."""
    try:
        return parse_watch(
            request.query.getall("id", []),
            request.query.getall("prefix", []),
            names=("id", "prefix"),
        )
    except ValueError as exc:
        raise web.HTTPBadRequest(
            text=orjson.dumps({"code": "InvalidWatch", "message": str(exc)}).decode(),
            content_type="application/json",
        ) from None


def next_page(route: str, limit: int, watch: Watch, last_id: str) -> str:
    """The relative URL of the page after `last_id`, with the same limit and watch."""
    params = [("limit", str(limit)), *watch.to_query(), ("marker", encode_marker(last_id))]
    return f"{route}?{urlencode(params, safe='/', quote_via=quote)}"


def add_routes(app: web.Application, service: Service) -> None:
    config = service.config

    async def changefeeds(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await handle_websocket(request, service)
        return json_response(
            {
                "resources": [r.to_wire() for r in config.resources],
                "partitions": config.bucket.partitions,
            }
        )

    async def stats(request: web.Request) -> web.Response:
        return json_response(
            {
                "listeners": len(service.hub.connections),
                "registrations": service.hub.stats(service.id),
                "publisher": service.id,
                "tail": service.tail.stats(),
                "closed": dict(service.hub.closed),
            }
        )

    def bootstrap(resource: Resource) -> Any:
        async def page(request: web.Request) -> web.Response:
            limit = _limit(request, config.limits.page_size, config.limits.max_page_size)
            marker = request.query.get("marker")
            try:
                after = None if marker is None else decode_marker(marker)
            except ValueError as exc:
                return json_error(400, "InvalidMarker", f"marker: {exc}")
            unknown = set(request.query) - {"limit", "marker", "id", "prefix"}
            if unknown:
                return json_error(
                    400, "InvalidQuery", f"unknown parameter(s): {', '.join(sorted(unknown))}"
                )
            watch = _watch(request)
            if watch.everything:
                result = await service.bucket.page(resource.resource, after, limit)
            else:
                result = await page_watched(service.bucket, resource.resource, watch, after, limit)
            next_url = None
            if len(result.ids) == limit:
                next_url = next_page(resource.bootstrap_route, limit, watch, result.ids[-1])
            cursor = result.cursor.encode() if result.cursor else None
            body = (
                b'{"items":['
                + b",".join(s for s in result.states if s is not None)
                + b'],"next":'
                + orjson.dumps(next_url)
                + b',"cursor":'
                + orjson.dumps(cursor)
                + b"}"
            )
            return web.Response(body=body, content_type="application/json")

        async def one(request: web.Request) -> web.Response:
            id = request.match_info["id"]
            state = await service.bucket.get(resource.resource, id)
            if state is None:
                return json_error(404, "ResourceNotFound", f"no {resource.resource} {id!r}")
            return web.Response(body=state, content_type="application/json")

        return page, one

    app.router.add_get("/changefeeds", changefeeds)
    app.router.add_get("/changefeeds/stats", stats)
    for resource in config.resources:
        page, one = bootstrap(resource)
        app.router.add_get(resource.bootstrap_route, page)
        app.router.add_get(resource.bootstrap_route + "/{id:.+}", one)
