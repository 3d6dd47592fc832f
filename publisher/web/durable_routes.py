"""The HTTP routes of durable pull consumers (docs/pull.md#durable-consumers, docs/http.md):

    GET    /changefeeds/durable                      the consumers (names, configured and stored)
    PUT    /changefeeds/durable/<name>               create                  201, 200 (same), 409
    GET    /changefeeds/durable/<name>               info                    200, 404
    DELETE /changefeeds/durable/<name>               delete                  200, 404
    POST   /changefeeds/durable/<name>/fetch         fetch (long poll)       200, 404
    POST   /changefeeds/durable/<name>/ack           settle: ack, nak, in_progress, term
    GET    /changefeeds/durable/<name>/dead          the dead-letter record

Each needs the scope `durable:<name>` (`durable:*` for the list), and a name that config.js lists
in `durable.consumers` (403 `UnknownConsumer` otherwise: closed by default; info and delete are
also allowed for a consumer stored in Redis whose name was removed from the list since). Errors
are `{"code", "message"}` with a 4xx status, 503 while Redis is down.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import structlog
from aiohttp import web

from changefeed.durable import (
    DURABLE,
    NAME,
    Action,
    parse_config,
    parse_fetch,
    parse_settle,
)
from changefeed.errors import (
    CommitOutcomeUnknown,
    ConsumerExists,
    CursorGone,
    NoSuchConsumer,
    ParamError,
)
from changefeed.longpoll import parse_int
from publisher.pull.durable import Durables
from publisher.web.access import Handler, requires
from publisher.web.app_keys import LIVE
from publisher.web.http import json_error, json_response, read_body, refusal_response
from publisher.web.query import takes
from publisher.web.registrations import Why, refusal_of, refused

log = structlog.get_logger(__name__)

DURABLES = web.AppKey("durables", Durables)
MAX_DEAD_PAGE = 1000
"""Dead-letter records one request returns at most."""


def _scope(request: web.Request) -> str:
    return "durable:" + request.match_info.get("name", "*")


class _Refused(Exception):
    """A request refused before it reaches the consumer: its response."""

    def __init__(self, response: web.Response) -> None:
        self.response = response


_Run = Callable[[web.Request, Durables, str], Awaitable[web.Response]]
"""What a consumer's route does once its name is checked: (request, durables, name) -> answer."""


def _checked(request: web.Request, *, stored_ok: bool = False) -> str:
    """The consumer name of the path, refused unless it is well formed and configured (or
    `stored_ok`: the route also serves a consumer only stored in Redis)."""
    name = request.match_info["name"]
    if not NAME.match(name):
        raise _Refused(json_error(
            400, "InvalidParameter",
            f"consumer name {name[:60]!r} must be 1 to 50 letters, digits, '_', '.' or '-'",
        ))
    if name not in request.app[LIVE].config.durable.consumers and not stored_ok:
        raise _Refused(_unknown(name))
    return name


async def _body_of(request: web.Request) -> Any:
    """The request's JSON body (None when empty), refused when it is not JSON."""
    body = await read_body(request, request.app[LIVE].config.server.body_timeout)
    if isinstance(body, web.Response):
        raise _Refused(body)
    if not body.strip():
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise _Refused(json_error(400, "InvalidJSON", f"the body is not JSON: {exc}")) from None


def consumer_route(*, stored_ok: bool = False) -> Callable[[_Run], Handler]:
    """Make `run(request, durables, name)` a handler: it needs `durable:<name>`, and refusals,
    parameter errors and a missing consumer become their JSON answers."""

    def wrap(run: _Run) -> Handler:
        @requires(_scope)
        async def handle(request: web.Request) -> web.Response:
            try:
                name = _checked(request, stored_ok=stored_ok)
                return await run(request, request.app[DURABLES], name)
            except _Refused as refused:
                return refused.response
            except ParamError as exc:
                return json_error(400, "InvalidParameter", str(exc))
            except NoSuchConsumer as exc:
                if exc.name not in request.app[LIVE].config.durable.consumers:
                    return _unknown(exc.name)
                return refusal_response(refusal_of(exc))

        return handle

    return wrap


@requires(_scope)
async def listing(request: web.Request) -> web.Response:
    """`GET /changefeeds/durable`: the consumers config.js names, and those stored in Redis."""
    stored = await request.app[DURABLES].store.names()
    configured = request.app[LIVE].config.durable.consumers
    return json_response({"configured": sorted(configured), "stored": stored})


@consumer_route()
async def create(request: web.Request, durables: Durables, name: str) -> web.Response:
    config = request.app[LIVE].config
    durable = config.durable
    consumer = parse_config(
        await _body_of(request), config.resource_map,
        max_ack_wait=durable.max_ack_wait, max_ack_pending=durable.max_ack_pending,
    )
    try:
        created, info = await durables.create(name, consumer)
    except (ConsumerExists, CursorGone) as exc:
        return refusal_response(refusal_of(exc))
    if created:
        log.info("durable consumer created", consumer=name, config=info["config"])
    return json_response(info, 201 if created else 200)


@consumer_route(stored_ok=True)
async def info(request: web.Request, durables: Durables, name: str) -> web.Response:
    return json_response(await durables.info(name))


@consumer_route(stored_ok=True)
async def delete(request: web.Request, durables: Durables, name: str) -> web.Response:
    if not await durables.delete(name):
        raise NoSuchConsumer(name)
    log.info("durable consumer deleted", consumer=name)
    return json_response({"deleted": name})


@consumer_route()
async def fetch(request: web.Request, durables: Durables, name: str) -> web.Response:
    query = parse_fetch(await _body_of(request), request.app[LIVE].config.limits)
    reply = await durables.fetch(name, query)
    return json_response(reply.to_wire())


@takes("after", "limit", code="InvalidParameter")
@consumer_route(stored_ok=True)
async def dead(request: web.Request, durables: Durables, name: str) -> web.Response:
    after = request.query.get("after") or None
    if after is not None and not _record_id(after):
        raise ParamError(f"after must be a record id (<ms>-<seq>), not {after[:60]!r}")
    limit = parse_int("limit", request.query.get("limit", "100"))
    if not 1 <= limit <= MAX_DEAD_PAGE:
        raise ParamError(f"limit must be from 1 to {MAX_DEAD_PAGE}, not {limit}")
    return json_response(await durables.dead_letters(name, after, limit))


@consumer_route()
async def settle(request: web.Request, durables: Durables, name: str) -> web.Response:
    """`POST .../<name>/ack` (or nak, in_progress, term: the action is the path's last
    segment, as its route names it)."""
    action = Action(request.path.rpartition("/")[2])
    durable = request.app[LIVE].config.durable
    query = parse_settle(
        await _body_of(request), action,
        most=request.app[LIVE].config.limits.max_results, max_delay=durable.max_ack_wait,
    )
    try:
        reply = await durables.settle(name, action, query)
    except CommitOutcomeUnknown as exc:
        log.warning("settlement outcome unknown", consumer=name, action=action.value,
                    error=str(exc))
        return refusal_response(refused(
            Why.OUTCOME_UNKNOWN,
            f"Redis did not answer the {action.value}: it may or may not have taken "
            "effect. Send it again: a delivery already settled answers not_pending",
        ))
    return json_response(reply.to_wire())


routes = [
    web.get(DURABLE, listing),
    web.put(DURABLE + "/{name}", create),
    web.get(DURABLE + "/{name}", info),
    web.delete(DURABLE + "/{name}", delete),
    web.post(DURABLE + "/{name}/fetch", fetch),
    web.get(DURABLE + "/{name}/dead", dead),
    *(web.post(f"{DURABLE}/{{name}}/{action.value}", settle) for action in Action),
]
"""The durable consumer routes; their handlers find the consumers under `app[DURABLES]`."""


def _unknown(name: str) -> web.Response:
    return refusal_response(refused(
        Why.UNKNOWN_CONSUMER,
        f"durable consumer {name!r} is not one of durable.consumers in this publisher's "
        "config.js",
    ))


def _record_id(text: str) -> bool:
    ms, dash, seq = text.partition("-")
    return bool(dash) and ms.isascii() and ms.isdigit() and seq.isascii() and seq.isdigit()


__all__ = ["DURABLES", "MAX_DEAD_PAGE", "routes"]
