"""The bootstrap routes (each resource's pages and objects), and /changefeeds/stats.

The module is named for the wire's `bootstrapRoute`. Its `routes` are the fixed one (the
stats); `resource_routes(resources)` are those of config.js's resources.

Every error is a JSON body `{"code", "message"}` with a 4xx status (503 when Redis is down,
through `publisher.web.http.error_as_json`); bad input never produces a 500. docs/http.md documents
the formats. The handlers are module-level: they find the config, bucket and hub under the
application's keys (`publisher.web.app_keys`), and a bootstrap route's resource under `BOOTSTRAPS`,
by the pattern of the route the request matched (`bootstraps_of`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from urllib.parse import quote, urlencode

import orjson
from aiohttp import web

from changefeed.errors import CursorError, ParamError
from changefeed.longpoll import parse_wait
from changefeed.protocol import Resource
from changefeed.watch import Watch, parse_watch
from publisher.bucket import decode_marker, encode_marker
from publisher.web.app_keys import BOOTSTRAPS, BUCKET, HUB, LIVE
from publisher.web.fleet import stats_of_scope
from publisher.web.http import bad_request, json_error, refusal_response
from publisher.web.query import takes
from publisher.web.registrations import Why, refused
from publisher.web.watch_pages import page_watched


def _limit(request: web.Request, default: int, maximum: int) -> int:
    text = request.query.get("limit")
    if text is None:
        return default
    # ASCII digits only: `'²'.isdigit()` is true and `int('²')` raises.
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= maximum:
        raise bad_request("InvalidLimit", f"limit must be an integer from 1 to {maximum}")
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
        raise bad_request("InvalidWatch", str(exc)) from None


async def at_least(request: web.Request) -> web.Response | None:
    """`?min_cursor=` (and `?wait=`): None once the bucket's head is at or past the cursor, so
    that what the route reads next holds that change; else the error to answer.

    A cursor of another epoch is 410 `CursorGone` (bootstrap from scratch, it will never be
    reached); one ahead of the head (a writer served by a publisher, or Redis, that is ahead of
    ours) waits up to `wait` (`changefeed.longpoll.parse_wait`: absent `limits.wait`, 0 not at
    all, at most `limits.maxWait`) on the hub's shared wake-up, then is 504 `MinCursorTimeout`.
    """
    text = request.query.get("min_cursor")
    if text is None:
        return None
    hub = request.app[HUB]
    bucket = request.app[BUCKET]
    try:
        wanted = await bucket.log.decode_cursor(text)
    except CursorError as exc:
        return json_error(400, "InvalidCursor", f"min_cursor: {exc}")
    try:
        wait = parse_wait("wait", request.query.get("wait"), request.app[LIVE].config.limits)
    except ParamError as exc:
        return json_error(400, "InvalidWait", str(exc))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        head = await bucket.log.head()
        if head is None or head.epoch != wanted.epoch:
            return refusal_response(refused(
                Why.CURSOR_GONE,
                f"min_cursor {text} is of another bucket epoch than "
                f"{head.epoch if head else None}: the bucket was recreated; bootstrap without it",
            ))
        if head.covers(wanted):
            return None
        remaining = deadline - loop.time()
        if remaining <= 0 or not await hub.wait_covers(wanted, remaining):
            return json_error(
                504, "MinCursorTimeout",
                f"the bucket's head ({head}) did not reach min_cursor {text} within {wait:g} s",
            )


def next_page(route: str, limit: int, watch: Watch, last_id: str) -> str:
    """The relative URL of the page after `last_id`, with the same limit and watch."""
    params = [("limit", str(limit)), *watch.to_query(), ("marker", encode_marker(last_id))]
    return f"{route}?{urlencode(params, safe='/', quote_via=quote)}"


@takes("scope")
async def handle_stats(request: web.Request) -> web.Response:
    """GET /changefeeds/stats: this process, or ?scope=fleet (publisher.web.fleet)."""
    return await stats_of_scope(request)


def _resource_of(request: web.Request) -> Resource:
    """The resource whose bootstrap route `request` matched (kept under `BOOTSTRAPS` by the
    route's pattern: a route's GET and HEAD share it)."""
    matched = request.match_info.route.resource
    assert matched is not None  # a route of resource_routes, not one of aiohttp's own (404)
    return request.app[BOOTSTRAPS][matched.canonical]


@takes("limit", "marker", "min_cursor", "wait", repeated=("id", "prefix"))
async def handle_page(request: web.Request) -> web.Response:
    """GET <bootstrapRoute>: a page of the resource's objects (`?limit`, `?marker`, a watch's
    `?id`/`?prefix`, `?min_cursor`/`?wait`), with the next page's URL and the cursor."""
    resource = _resource_of(request)
    limits = request.app[LIVE].config.limits
    limit = _limit(request, limits.page_size, limits.max_page_size)
    marker = request.query.get("marker")
    try:
        after = None if marker is None else decode_marker(marker)
    except ValueError as exc:
        return json_error(400, "InvalidMarker", f"marker: {exc}")
    watch = _watch(request)
    refused = await at_least(request)
    if refused is not None:
        return refused
    bucket = request.app[BUCKET]
    if watch.everything:
        result = await bucket.page(resource.resource, after, limit)
    else:
        result = await page_watched(bucket, resource.resource, watch, after, limit)
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


@takes("min_cursor", "wait")
async def handle_one(request: web.Request) -> web.Response:
    """GET <bootstrapRoute>/<id>: one object of the resource (`?min_cursor`/`?wait` too)."""
    resource = _resource_of(request)
    id = request.match_info["id"]
    refused = await at_least(request)
    if refused is not None:
        return refused
    state = await request.app[BUCKET].get(resource.resource, id)
    if state is None:
        return json_error(404, "ResourceNotFound", f"no {resource.resource} {id!r}")
    return web.Response(body=state, content_type="application/json")


routes = [web.get("/changefeeds/stats", handle_stats)]

ONE = "/{id:.+}"
"""The pattern of one object's route, under its resource's bootstrap route."""


def resource_routes(resources: Iterable[Resource]) -> list[web.RouteDef]:
    """The bootstrap routes of `resources`: a page of each, and one object of each."""
    return [
        route
        for resource in resources
        for route in (web.get(resource.bootstrap_route, handle_page),
                      web.get(resource.bootstrap_route + ONE, handle_one))
    ]


def bootstraps_of(resources: Iterable[Resource]) -> dict[str, Resource]:
    """What goes under `BOOTSTRAPS`: each resource by the patterns of its bootstrap routes (as
    aiohttp writes them: `canonical`)."""
    found: dict[str, Resource] = {}
    for resource in resources:
        found[resource.bootstrap_route] = found[resource.bootstrap_route + "/{id}"] = resource
    return found
