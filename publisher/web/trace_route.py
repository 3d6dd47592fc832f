"""`GET /changefeeds/trace/<cursor>`: what this publisher did with one change
(publisher.delivery.trace).

It needs the `stats` scope (or `admin`): like `/changefeeds/stats` it tells who listens and when
they were sent what. A malformed cursor is 400 `InvalidCursor`; a change this publisher has no
record of is 404 with the reason's code (`NotTraced`: outside the trace window, `NotReadYet`,
`OtherEpoch`, `NoSuchChange`; `TraceDisabled` when `trace.items` is 0). On a bucket in a Redis
Cluster the cursor is the composite one a commit returned (one position: the change's own).
Every answer names the publisher and its trace window. docs/http.md documents the shape;
`changefeed trace` asks every publisher of the fleet.
"""

from __future__ import annotations

import time

from aiohttp import web

from changefeed.cursor import ZERO, Position
from changefeed.errors import CursorError
from publisher.delivery.trace import NotTraced, Record, record_body
from publisher.web.access import requires
from publisher.web.app_keys import HUB, LIFECYCLE
from publisher.web.http import json_error, json_response

TRACE_ROUTE = "/changefeeds/trace"
STATS = "stats"


@requires(STATS)
async def handle_trace(request: web.Request) -> web.Response:
    text = request.match_info.get("cursor", "")
    if not text:
        return json_error(400, "InvalidCursor", f"name a cursor: {TRACE_ROUTE}/<cursor>")
    hub = request.app[HUB]
    publisher_id = request.app[LIFECYCLE].publisher_id
    trace = hub.trace
    if trace is None:
        return json_response(
            {"code": "TraceDisabled", "publisher": publisher_id,
             "message": "this publisher records no trace (trace.items is 0 in its config)"},
            404,
        )
    try:
        vector = await hub.bucket.log.decode_cursor(text)
    except CursorError as exc:
        return json_error(400, "InvalidCursor", f"cursor: {exc}")
    own = [(s, at) for s, at in enumerate(vector.positions) if at != ZERO] or [(0, ZERO)]
    if len(own) != 1:
        return json_error(400, "InvalidCursor", "cursor: name the cursor a commit returned "
                          "(one position: the change's own), not a listener's")
    shard, position = own[0]
    window = trace.describe(hub.epoch)
    local = hub.order.local(shard, position)
    cursor = Position.single(vector.epoch, position)
    if local is None and vector.epoch == hub.epoch:  # not among the newest: say why
        found: Record | NotTraced = NotTraced(
            "NotReadYet", "not traced: this publisher's tail has not read it yet"
        ) if position > hub.position(shard) else NotTraced(
            "NotTraced", f"not traced: older than the trace window of {trace.window()}, or "
            "read before this publisher began tracing")
    else:
        found = trace.find(Position.single(vector.epoch, local or position), hub.epoch,
                           hub.window.head, time.time())
    if isinstance(found, NotTraced):
        return json_response(
            {"code": found.code, "message": found.message, "publisher": publisher_id,
             "window": window},
            404,
        )
    return json_response({**record_body(found, cursor, publisher_id, text), "window": window})


routes = [web.get(TRACE_ROUTE, handle_trace), web.get(TRACE_ROUTE + "/{cursor}", handle_trace)]


__all__ = ["TRACE_ROUTE", "handle_trace", "routes"]
