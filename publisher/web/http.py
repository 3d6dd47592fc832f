"""JSON over HTTP: the response helpers every route uses, and `error_as_json`, which turns every
error of a handler into a JSON body `{"code", "message"}` (for the middleware, publisher.web.edge).

| error                         | answer                                                   |
| ----------------------------- | -------------------------------------------------------- |
| an aiohttp `HTTPException`    | its status, code = its reason without spaces              |
| `BucketBusy`                  | 503 `Overloaded`, `Retry-After` (no Redis connection free) |
| `EpochNotRead`                | 503 `EpochNotRead`, `Retry-After` (a new epoch not read yet) |
| `BucketUnavailable`           | 503 `BucketUnavailable`, `Retry-After` (Redis unreachable) |
| any other `ChangefeedError`   | 500 `InternalError` (a Redis error reply: the deployment)  |

The three bucket rows are `BUCKET_ANSWERS`, which registrations share
(publisher.web.registrations). Bad input never produces a 500: handlers answer it with
`json_error(400, ...)` or raise `bad_request`. docs/http.md documents the formats.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import structlog
from aiohttp import web

from changefeed.errors import BucketBusy, BucketUnavailable, ChangefeedError, EpochNotRead
from publisher.config.logs import Throttle

log = structlog.get_logger(__name__)

UNAVAILABLE = "change bucket unavailable, try again later"
OVERLOADED = "publisher overloaded: no Redis connection came free in time, try again later"
RETRY_OVERLOADED = 1
"""Seconds a client is asked to wait (`Retry-After`) when the publisher is overloaded."""
RETRY_UNAVAILABLE = 5
"""Seconds a client is asked to wait (`Retry-After`) while Redis cannot be reached."""
EPOCH_NOT_READ = ("change bucket began a new epoch that this publisher has not read yet, "
                  "try again later")
RETRY_EPOCH_NOT_READ = 1
"""Seconds a client is asked to wait (`Retry-After`) while the tail takes up a new epoch."""

_overload_log = Throttle(10.0)


@dataclass(frozen=True, slots=True)
class Answer:
    """The HTTP answer to an error of the bucket: status, JSON code and message, Retry-After."""

    status: int
    code: str
    message: str
    retry_after: int


BUCKET_ANSWERS: Mapping[type[BucketUnavailable], Answer] = {
    BucketBusy: Answer(503, "Overloaded", OVERLOADED, RETRY_OVERLOADED),
    EpochNotRead: Answer(503, "EpochNotRead", EPOCH_NOT_READ, RETRY_EPOCH_NOT_READ),
    BucketUnavailable: Answer(503, "BucketUnavailable", UNAVAILABLE, RETRY_UNAVAILABLE),
}
"""The one table of the bucket's errors over HTTP, for every route (and, with their close
codes, for registrations: publisher.web.registrations)."""


def bucket_answer(exc: BucketUnavailable) -> Answer:
    """The answer to `exc`: its nearest class in `BUCKET_ANSWERS`."""
    return next(BUCKET_ANSWERS[kind] for kind in type(exc).__mro__ if kind in BUCKET_ANSWERS)


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def json_error(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    return json_response({"code": code, "message": message}, status, headers)


def bad_request(code: str, message: str) -> web.HTTPBadRequest:
    """A 400 with our JSON body, to raise from a helper deep in a handler."""
    return web.HTTPBadRequest(
        text=orjson.dumps({"code": code, "message": message}).decode(),
        content_type="application/json",
    )


def overloaded(path: str, exc: BucketBusy) -> None:
    """Log an overload, at most once per interval for the whole process (it comes in floods)."""
    suppressed = _overload_log.allow("overload")
    if suppressed is not None:
        log.warning("request refused: overloaded", path=path, error=str(exc), suppressed=suppressed)


def error_as_json(
    request: web.Request, exc: web.HTTPException | ChangefeedError
) -> web.Response | None:
    """The JSON answer to `request` whose handler raised `exc`: HTTP errors keep their status,
    Redis trouble is 503. None for an HTTP error to raise as it is (a redirect or the like, or
    one with a JSON body already). The publisher's middleware (publisher.web.edge) asks it for
    every error of a handler."""
    if isinstance(exc, web.HTTPException):
        if exc.content_type == "application/json" or exc.status < 400:
            return None
        code = exc.reason.replace(" ", "")
        message = {
            404: f"no route {request.method} {request.path}",
            405: f"method {request.method} not allowed on {request.path}",
        }.get(exc.status, exc.text or exc.reason)
        return json_error(exc.status, code, message)
    if isinstance(exc, BucketUnavailable):
        if isinstance(exc, BucketBusy):
            overloaded(request.path, exc)
        elif isinstance(exc, EpochNotRead):
            log.info("request refused: a new epoch not read yet", path=request.path,
                     error=str(exc))
        else:
            log.warning("request failed: bucket unavailable", path=request.path, error=str(exc))
        answer = bucket_answer(exc)
        return json_error(answer.status, answer.code, answer.message,
                          retry_after(answer.retry_after))
    log.error("request failed", path=request.path, error=str(exc))
    return json_error(500, "InternalError", str(exc))


async def read_body(request: web.Request, timeout: float) -> bytes | web.Response:
    """The request's body, or, when it does not arrive within `timeout` seconds
    (`server.bodyTimeout`), the 408 to answer with (its connection closed after it)."""
    try:
        async with asyncio.timeout(timeout):
            return await request.read()
    except TimeoutError:
        late = json_error(
            408, "RequestTimeout",
            f"request body not received within {timeout:g} s (server.bodyTimeout)",
        )
        late.force_close()
        return late


class Refusal(Protocol):
    """What `refusal_response` answers: publisher.web.registrations' `Refused`."""

    @property
    def http_status(self) -> int: ...
    @property
    def code(self) -> str: ...
    @property
    def reason(self) -> str: ...
    def headers(self) -> dict[str, str] | None: ...


def refusal_response(refusal: Refusal) -> web.Response:
    """The HTTP answer of a refusal of publisher.web.registrations' table: its status, its JSON
    code and reason, its `Retry-After`."""
    return json_error(refusal.http_status, refusal.code, refusal.reason, refusal.headers())


def retry_after(seconds: int) -> dict[str, str]:
    return {"Retry-After": str(seconds)}


__all__ = [
    "BUCKET_ANSWERS",
    "OVERLOADED",
    "UNAVAILABLE",
    "Answer",
    "Refusal",
    "bad_request",
    "bucket_answer",
    "error_as_json",
    "json_error",
    "json_response",
    "overloaded",
    "read_body",
    "refusal_response",
    "retry_after",
]
