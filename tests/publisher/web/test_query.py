"""The query of every route, checked alike on a real publisher (publisher.web.query): unknown and
repeated parameters refused naming them, errors naming the parameter the user sent, the one
meaning of a wait (`changefeed.longpoll.parse_wait`), and a handshake without its key."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from changefeed import feed, longpoll
from changefeed.cursor import new_epoch
from changefeed.errors import BucketBusy, ConsumerExists, CursorGone, NoSuchConsumer
from publisher.config.settings import Config
from publisher.server.service import Service
from publisher.web import poll_routes
from publisher.web.query import Takes, problem, takes_of
from publisher.web.registrations import Why, refusal_of, refused
from tests.conftest import PublisherFactory
from tests.servers import RedisServer, scaled

WAIT = 1.0
MAX_WAIT = 1.5


@pytest.fixture
async def service(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> AsyncIterator[Service]:
    config = make_config(
        redis_server.url, limits={"wait": WAIT, "maxWait": MAX_WAIT},
        durable={"consumers": ["billing"]}, feed={"consumers": ["billing"]},
    )
    async with start_publisher(config) as service:
        await service.bucket.commit("vm", "x1", ["nic"], {"uuid": "x1"})
        yield service


async def _call(
    service: Service, method: str, target: str, json: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, float]:
    """(status, JSON body, seconds taken) of one request."""
    started = time.monotonic()
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, service.url + target, json=json, headers=headers) as response,
    ):
        body = await response.json(content_type=None)
        return response.status, body, time.monotonic() - started


# --- the pure check ------------------------------------------------------------------------


def test_problem_names_unknown_and_repeated_parameters() -> None:
    takes = Takes(frozenset({"limit"}), frozenset({"id"}), frozenset({"cursor"}))
    assert problem(["limit", "id", "id", "cursor0", "cursor12"], takes) is None
    assert problem(["foo", "limit"], takes) == (
        "unknown parameter(s) 'foo' (known: id, limit, cursor0, cursor1...)"
    )
    assert problem(["limit", "limit"], takes) == "parameter(s) 'limit' may be given only once"
    assert problem(["cursor1", "cursor1"], takes) == (
        "parameter(s) 'cursor1' may be given only once"
    )
    assert problem(["cursor", "cursorx"], takes) is not None
    assert problem(["x"], Takes()) == "unknown parameter(s) 'x' (known: none)"


# --- every route refuses unknown and repeated parameters alike -----------------------------

ROUTES = [
    ("GET", "/vms", "InvalidQuery"),
    ("GET", "/vms/x1", "InvalidQuery"),
    ("GET", "/changefeeds", "InvalidQuery"),
    ("GET", "/changefeeds/stats", "InvalidQuery"),
    ("GET", "/changefeeds/events", "InvalidParameter"),
    ("GET", "/changefeeds/feed/v1", "InvalidParameter"),
    ("GET", "/changefeeds/sse", "InvalidQuery"),
    ("GET", "/changefeeds/durable", "InvalidQuery"),
    ("GET", "/changefeeds/durable/billing", "InvalidQuery"),
    ("POST", "/changefeeds/durable/billing/fetch", "InvalidQuery"),
    ("POST", "/changefeeds/durable/billing/ack", "InvalidQuery"),
    ("GET", "/changefeeds/durable/billing/dead", "InvalidParameter"),
    ("GET", "/changefeeds/trace/x", "InvalidQuery"),
    ("GET", "/healthz", "InvalidQuery"),
    ("GET", "/readyz", "InvalidQuery"),
    ("GET", "/metrics", "InvalidQuery"),
    ("GET", "/changefeeds/dashboard", "InvalidQuery"),
]


async def test_every_route_refuses_an_unknown_parameter_naming_it(service: Service) -> None:
    for method, path, code in ROUTES:
        status, body, _ = await _call(service, method, path + "?foo=1")
        assert status == 400, (path, body)
        assert body["code"] == code, (path, body)
        assert "unknown parameter(s) 'foo' (known: " in body["message"], (path, body)


def test_the_pull_routes_take_what_their_parsers_read() -> None:
    """The one check of the events and feed queries is their route's `takes`
    (`longpoll.from_query` and `feed.parse_request` check no names): it knows the parsers'
    parameters, no more and no fewer."""
    events, fed = takes_of(poll_routes.events_get), takes_of(poll_routes.feed_get)
    assert events.single | events.repeated == set(longpoll.QUERY_PARAMETERS)
    assert events.repeated == {"sub", "id", "prefix"}
    assert (fed.single, fed.repeated, fed.numbered) == (
        frozenset(feed.PARAMETERS), frozenset(), frozenset({"cursor"})
    )


async def test_the_pull_routes_refuse_a_repeated_parameter(service: Service) -> None:
    for path, name in (("/changefeeds/feed/v1?n=1&n=1&cursor0=_first", "n"),
                       ("/changefeeds/feed/v1?n=1&cursor0=_first&cursor0=_last", "cursor0"),
                       ("/changefeeds/events?after=x&after=y", "after")):
        status, body, _ = await _call(service, "GET", path)
        assert (status, body["code"]) == (400, "InvalidParameter"), (path, body)
        assert body["message"] == f"parameter(s) {name!r} may be given only once", body


async def test_json_rpc_refuses_a_query_as_a_json_rpc_error(service: Service) -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "events"}
    status, body, _ = await _call(service, "POST", "/changefeeds/rpc?foo=1", call)
    assert status == 400
    assert body["error"]["code"] == -32600 and "'foo'" in body["error"]["message"]


async def test_one_object_takes_only_min_cursor_and_wait(service: Service) -> None:
    status, body, _ = await _call(service, "GET", "/vms/x1?limit=5")
    assert (status, body["code"]) == (400, "InvalidQuery")
    assert body["message"] == "unknown parameter(s) 'limit' (known: min_cursor, wait)"
    status, body, _ = await _call(service, "GET", "/vms/x1")
    assert (status, body) == (200, {"uuid": "x1"})


async def test_a_repeated_single_parameter_is_refused_a_repeatable_one_is_not(
    service: Service,
) -> None:
    status, body, _ = await _call(service, "GET", "/vms?limit=2&limit=3")
    assert (status, body["code"]) == (400, "InvalidQuery")
    assert body["message"] == "parameter(s) 'limit' may be given only once"
    status, body, _ = await _call(service, "GET", "/vms?id=x1&id=x2&prefix=a&prefix=b")
    assert status == 200 and body["items"] == [{"uuid": "x1"}]
    status, body, _ = await _call(service, "GET", "/changefeeds/sse?resource=vm&resource=vm")
    assert (status, body["code"]) == (400, "InvalidQuery") and "'resource'" in body["message"]
    status, body, _ = await _call(service, "GET", "/changefeeds/stats?scope=fleet&scope=fleet")
    assert status == 400 and "'scope'" in body["message"]


# --- errors name the query parameter the user sent ------------------------------------------

NAMED = [
    ("/changefeeds/sse?resource=vm",
     "sub: at least one sub-resource is required (sub=nic, or sub=* for all)"),
    ("/changefeeds/sse?sub=nic", "resource: name the resource to listen to (known: network, vm)"),
    ("/changefeeds/sse?resource=disk&sub=nic", "resource: unknown resource 'disk'"),
    ("/changefeeds/sse?resource=vm&sub=ips", "sub: unknown sub-resource 'ips' of 'vm'"),
    ("/changefeeds/sse?resource=vm&sub=nic&prefix=/", "prefix must not hold an empty prefix"),
    ("/changefeeds/sse?resource=vm&sub=nic&id=x&id=", "id must"),
    ("/changefeeds/sse?resource=vm&sub=nic&instance=", "instance: must not be empty"),
    ("/changefeeds/events?sub=nic", "sub needs resource: the resource whose sub-resources"),
    ("/changefeeds/events?resource=vm&sub=ips", "sub: unknown sub-resource 'ips' of 'vm'"),
    ("/changefeeds/events?prefix=/", "prefix must not hold an empty prefix"),
]


@pytest.mark.parametrize(("target", "message"), NAMED)
async def test_errors_name_the_query_parameter(
    service: Service, target: str, message: str
) -> None:
    status, body, _ = await _call(service, "GET", target)
    assert status == 400, body
    assert body["message"].startswith(message), body


async def test_json_rpc_errors_name_the_filter_keys(service: Service) -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "events",
            "params": {"filter": {"subResources": ["nic"]}}}
    status, body, _ = await _call(service, "POST", "/changefeeds/rpc", call)
    assert status == 400
    assert "filter.subResources needs filter.resource" in body["error"]["message"]


# --- a handshake without its key --------------------------------------------------------------

UPGRADE = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13"}


async def test_an_upgrade_without_its_key_is_a_clean_400(service: Service) -> None:
    status, body, _ = await _call(service, "GET", "/changefeeds", headers=UPGRADE)
    assert status == 400
    assert body == {
        "code": "InvalidHandshake",
        "message": "the websocket upgrade lacks the Sec-WebSocket-Key header (RFC 6455 4.1)",
    }
    bad = {**UPGRADE, "Sec-WebSocket-Key": "short"}
    status, body, _ = await _call(service, "GET", "/changefeeds", headers=bad)
    assert status == 400 and body["code"] == "InvalidHandshake"
    assert "Sec-WebSocket-Key 'short' is not the base64 of 16 bytes" in body["message"]


# --- one meaning of a wait -------------------------------------------------------------------


async def _head(service: Service) -> str:
    _, body, _ = await _call(service, "GET", "/vms")
    cursor: str = body["cursor"]
    return cursor


async def _events(service: Service, wait: str | None) -> tuple[int, Any, float]:
    after = await _head(service)
    query = f"?resource=vm&order=oldest&after={after}"
    return await _call(service, "GET", "/changefeeds/events" + query + (
        "" if wait is None else f"&wait_time={wait}"))


async def _rpc(service: Service, wait: Any) -> tuple[int, Any, float]:
    params = {"filter": {"resource": "vm"}, "order": "oldest", "after": await _head(service),
              "wait_time": wait}
    return await _call(service, "POST", "/changefeeds/rpc",
                       {"jsonrpc": "2.0", "id": 1, "method": "events", "params": params})


async def _feed(service: Service, wait: str | None) -> tuple[int, Any, float]:
    target = "/changefeeds/feed/v1?n=1&cursor0=_last" + ("" if wait is None else f"&wait={wait}")
    started = time.monotonic()
    async with aiohttp.ClientSession() as http, http.get(service.url + target) as response:
        text = await response.text()
        body = text if response.status == 200 else await response.json()
        return response.status, body, time.monotonic() - started


async def _fetch(service: Service, wait: Any) -> tuple[int, Any, float]:
    await _call(service, "PUT", "/changefeeds/durable/billing",
                {"filter": {"resource": "vm"}, "start": "last"})
    body = {} if wait is None else {"wait_time": wait}
    return await _call(service, "POST", "/changefeeds/durable/billing/fetch", body)


Ask = Callable[[Service, Any], Any]
ROUTES_WAITING: list[tuple[str, Ask, str]] = [
    ("events", _events, "wait_time"), ("rpc", _rpc, "wait_time"), ("feed", _feed, "wait"),
    ("fetch", _fetch, "wait_time"),
]


@pytest.mark.parametrize(("ask", "name"), [(a, n) for _, a, n in ROUTES_WAITING],
                         ids=[route for route, _, _ in ROUTES_WAITING])
async def test_every_route_waits_by_the_one_rule(service: Service, ask: Ask, name: str) -> None:
    # 0: answer at once, nothing being there.
    status, body, took = await ask(service, "0")
    assert status == 200, body
    assert took < WAIT * 0.8
    # Negative: a 400 naming the parameter.
    status, body, _ = await ask(service, "-1")
    assert status == 400, body
    message = body["error"]["message"] if "error" in body else body["message"]
    assert f"{name} must not be negative" in message, body
    # The same duration syntax everywhere; absent and above maxWait wait, concurrently.
    results = await asyncio.gather(ask(service, "300ms"), ask(service, None),
                                   ask(service, "100"))
    (short, _, short_took), (absent, _, absent_took), (long, _, long_took) = results
    assert short == absent == long == 200
    assert 0.25 <= short_took < WAIT
    assert WAIT * 0.9 <= absent_took < scaled(MAX_WAIT + 5)
    assert MAX_WAIT * 0.9 <= long_took < scaled(MAX_WAIT + 5)


async def test_min_cursor_waits_by_the_one_rule(service: Service) -> None:
    head = await _head(service)
    for wait in ("0", "500ms", "0.5", "100"):  # reached: answered; above maxWait: lowered
        status, body, _ = await _call(service, "GET", f"/vms/x1?min_cursor={head}&wait={wait}")
        assert status == 200, (wait, body)
    status, body, _ = await _call(service, "GET", f"/vms?min_cursor={head}&wait=-1")
    assert (status, body["code"]) == (400, "InvalidWait")
    assert body["message"].startswith("wait must not be negative")


# --- the pull handlers refuse through the admission core's table ------------------------------


async def test_a_min_cursor_of_another_epoch_is_gone_as_on_the_pull_routes(
    service: Service,
) -> None:
    head = await _head(service)
    other = new_epoch() + "." + head.partition(".")[2]
    status, body, _ = await _call(service, "GET", f"/vms?min_cursor={other}")
    assert (status, body["code"]) == (410, "CursorGone"), body
    status, body, _ = await _call(service, "PUT", "/changefeeds/durable/billing",
                                  {"filter": {"resource": "vm"}, "start": other})
    assert (status, body["code"]) == (410, "CursorGone"), body


def test_every_pull_refusal_is_a_rule_of_the_one_table() -> None:
    for exc, status, code in [
        (CursorGone("gone"), 410, "CursorGone"),
        (ConsumerExists("billing", ["ack_wait is 30.0, not 10.0"]), 409, "ConsumerExists"),
        (NoSuchConsumer("billing"), 404, "ConsumerNotFound"),
        (BucketBusy("busy"), 503, "Overloaded"),
    ]:
        refusal = refusal_of(exc)
        assert (refusal.http_status, refusal.code) == (status, code), exc
        assert refusal.reason
    assert refused(Why.UNKNOWN_CONSUMER, "x").http_status == 403
    assert refused(Why.OUTCOME_UNKNOWN, "x").headers() == {"Retry-After": "5"}
