"""The publisher's one middleware: what happens to every request around its handler.

In this order, for every request:

1. `Access.check` (publisher.web.access): refused (429, 403, 401...), a CORS preflight answered, or
   passed on with its identity and the CORS headers its answer gets; then the query checked
   against the parameters the route takes (`publisher.web.query.refusal`: 400);
2. the handler; an error it raises becomes a JSON answer (`publisher.web.http.error_as_json`), or
   is raised on when it already is one;
3. `Metrics.count` (publisher.web.metrics): the request by route pattern and status, refusals and
   errors too (an exception that is no HTTP error counts as 500; an upgraded websocket counts
   as its 101 however it ended, even cancelled when its connection was lost without a close
   frame: `changefeed_websocket_abnormal_closures_total` counts those).

One layer, not a middleware per concern: a websocket's handler runs for the life of its
connection, and every middleware layer between aiohttp and it would hold a coroutine frame for
all of that time, for every listener (docs/benchmarks.md, P5).
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from changefeed.errors import ChangefeedError
from publisher.web.access import CORS, Access
from publisher.web.http import error_as_json
from publisher.web.metrics import Metrics
from publisher.web.query import refusal as query_refusal
from publisher.web.websocket import UPGRADED


def edge(metrics: Metrics, access: Access) -> Middleware:
    """The middleware of a service with these metrics and access checks."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        status = 500
        try:
            refusal, cors = access.check(request)
            response: web.StreamResponse
            if refusal is not None:
                response = refusal
            else:
                if cors is not None:
                    request[CORS] = cors  # for answers prepared by their handler (SSE)
                try:
                    response = query_refusal(request) or await handler(request)
                except (web.HTTPException, ChangefeedError) as exc:
                    answer = error_as_json(request, exc)
                    if answer is None:
                        raise
                    response = answer
                if cors is not None and not response.prepared:
                    response.headers.update(cors)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            if request.get(UPGRADED) is not None:
                status = 101  # answered 101, then its handler was cancelled (connection lost)
            metrics.count(request, status)

    return middleware


__all__ = ["edge"]
