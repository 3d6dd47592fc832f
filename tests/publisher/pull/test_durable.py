"""The durable consumer routes on a real publisher and a real redis-server: create, fetch, ack,
nak, in_progress, term, redelivery, max deliveries, trimmed gaps, limits, bad requests, scopes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from changefeed.cursor import Position
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.servers import RedisServer, scaled

BASE = "/changefeeds/durable"
DURABLE = {"consumers": ["billing", "audit", "slow"], "maxAckPending": 50, "maxDeadLetters": 100}


@pytest.fixture
def durable_config(redis_server: RedisServer, make_config: Callable[..., Config]) -> Config:
    return make_config(redis_server.url, durable=DURABLE)


@pytest.fixture
async def service(durable_config: Config, start_publisher: PublisherFactory
                  ) -> AsyncIterator[Service]:
    async with start_publisher(durable_config) as started:
        yield started


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def call(http: aiohttp.ClientSession, service: Service, method: str, path: str,
               body: Any = None, **kwargs: Any) -> tuple[int, Any]:
    async with http.request(method, service.url + path, json=body, **kwargs) as response:
        assert response.content_type == "application/json", await response.text()
        return response.status, await response.json()


async def create(http: aiohttp.ClientSession, service: Service, name: str = "billing",
                 **config: Any) -> dict[str, Any]:
    status, info = await call(http, service, "PUT", f"{BASE}/{name}", config)
    assert status in (200, 201), info
    return dict(info)


async def fetch(http: aiohttp.ClientSession, service: Service, name: str = "billing",
                count: int = 100, wait: float = 0) -> dict[str, Any]:
    status, reply = await call(http, service, "POST", f"{BASE}/{name}/fetch",
                               {"max_messages": count, "wait_time": wait})
    assert status == 200, reply
    return dict(reply)


async def settle(http: aiohttp.ClientSession, service: Service, action: str,
                 deliveries: list[str], name: str = "billing", **extra: Any
                 ) -> list[dict[str, Any]]:
    status, reply = await call(http, service, "POST", f"{BASE}/{name}/{action}",
                               {"deliveries": deliveries, **extra})
    assert status == 200, reply
    return list(reply["results"])


async def commit(service: Service, prefix: str, count: int, sub: str = "nic") -> list[str]:
    return [await service.bucket.commit("vm", f"{prefix}/{n:03}", [sub], {"n": n})
            for n in range(count)]


def cursors(reply: dict[str, Any]) -> list[str]:
    return [m["cursor"] for m in reply["messages"]]


def deliveries(reply: dict[str, Any]) -> list[str]:
    return [m["delivery"] for m in reply["messages"]]


# --- create, info, delete ------------------------------------------------------------------------


async def test_create_is_idempotent_and_a_different_config_is_a_409_naming_the_keys(
    service: Service, http: aiohttp.ClientSession
) -> None:
    status, info = await call(http, service, "PUT", f"{BASE}/billing",
                              {"ack_wait": "10s", "filter": {"resource": "vm"}})
    assert status == 201
    assert info["config"] == {"filter": {"resource": "vm"}, "ack_wait": 10.0, "max_deliver": 5,
                              "max_ack_pending": 50, "start": "first"}
    assert info["pending"] == 0 and info["counts"]["delivered"] == 0
    status, again = await call(http, service, "PUT", f"{BASE}/billing",
                               {"ack_wait": 10, "filter": {"resource": "vm"}, "max_deliver": 5})
    assert status == 200 and again["config"] == info["config"]
    status, refused = await call(http, service, "PUT", f"{BASE}/billing",
                                 {"ack_wait": 20, "filter": {"resource": "network"}})
    assert status == 409 and refused["code"] == "ConsumerExists"
    assert "ack_wait is 10.0, not 20.0" in refused["message"]
    assert 'filter is {"resource":"vm"}, not {"resource":"network"}' in refused["message"]
    status, got = await call(http, service, "GET", f"{BASE}/billing")
    assert status == 200 and got["config"] == info["config"]
    status, listing = await call(http, service, "GET", BASE)
    assert status == 200 and listing == {"configured": ["audit", "billing", "slow"],
                                         "stored": ["billing"]}
    status, deleted = await call(http, service, "DELETE", f"{BASE}/billing")
    assert status == 200 and deleted == {"deleted": "billing"}
    status, gone = await call(http, service, "GET", f"{BASE}/billing")
    assert status == 404 and gone["code"] == "ConsumerNotFound"
    status, gone = await call(http, service, "DELETE", f"{BASE}/billing")
    assert status == 404


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code", "words"),
    [
        ("PUT", "/nobody", {}, 403, "UnknownConsumer", "durable.consumers"),
        ("POST", "/nobody/fetch", {}, 403, "UnknownConsumer", "durable.consumers"),
        ("PUT", "/bad%20name", {}, 400, "InvalidParameter", "letters, digits"),
        ("PUT", "/billing", {"colour": 1}, 400, "InvalidParameter", "unknown key(s) colour"),
        ("PUT", "/billing", [1], 400, "InvalidParameter", "JSON object"),
        ("PUT", "/billing", {"ack_wait": "soon"}, 400, "InvalidParameter", "ack_wait"),
        ("PUT", "/billing", {"ack_wait": 10 ** 9}, 400, "InvalidParameter", "ack_wait"),
        ("PUT", "/billing", {"max_deliver": 0}, 400, "InvalidParameter", "max_deliver"),
        ("PUT", "/billing", {"max_ack_pending": 51}, 400, "InvalidParameter", "from 1 to 50"),
        ("PUT", "/billing", {"filter": {"resource": "disk"}}, 400, "InvalidParameter",
         "unknown resource 'disk'"),
        ("PUT", "/billing", {"filter": {"resource": "vm", "subResources": ["x"]}}, 400,
         "InvalidParameter", "unknown sub-resource 'x'"),
        ("PUT", "/billing", {"start": "yesterday"}, 400, "InvalidParameter", "start"),
        ("POST", "/billing/fetch", {}, 404, "ConsumerNotFound", "create it first"),
        ("POST", "/billing/ack", {"deliveries": ["x"]}, 400, "InvalidParameter",
         "not a delivery id"),
        ("POST", "/billing/ack", {"deliveries": []}, 400, "InvalidParameter", "non-empty"),
        ("POST", "/billing/ack", {"deliveries": ["abcdefghij:1-1:1"], "delay": 1}, 400,
         "InvalidParameter", "delay applies to nak only"),
        ("POST", "/billing/nak", {"deliveries": ["abcdefghij:1-1:1"], "delay": -1}, 400,
         "InvalidParameter", "delay"),
        ("POST", "/billing/ack", {"deliveries": ["abcdefghij:1-1:1"]}, 404, "ConsumerNotFound",
         "billing"),
        ("GET", "/billing/dead", None, 404, "ConsumerNotFound", "billing"),
        ("GET", "/billing/dead?limit=0", None, 400, "InvalidParameter", "limit"),
        ("GET", "/billing/dead?colour=1", None, 400, "InvalidParameter", "colour"),
    ],
)
async def test_bad_requests_are_4xx_json_naming_the_fault(
    service: Service, http: aiohttp.ClientSession, method: str, path: str, body: Any,
    status: int, code: str, words: str,
) -> None:
    got, error = await call(http, service, method, BASE + path, body)
    assert (got, error["code"]) == (status, code), error
    assert words in error["message"]


async def test_a_body_that_is_not_json_is_a_400(
    service: Service, http: aiohttp.ClientSession
) -> None:
    async with http.put(f"{service.url}{BASE}/billing", data=b"{nope") as response:
        assert response.status == 400
        assert (await response.json())["code"] == "InvalidJSON"
    await create(http, service)
    status, error = await call(http, service, "POST", f"{BASE}/billing/fetch",
                               {"max_messages": "many"})
    assert status == 400 and "max_messages" in error["message"]
    status, error = await call(http, service, "GET", f"{BASE}/billing/dead?after=x")
    assert status == 400 and "record id" in error["message"]


# --- fetch and ack ----------------------------------------------------------------------------


async def test_fetch_hands_out_items_in_log_order_and_acks_say_whether_they_took_effect(
    service: Service, http: aiohttp.ClientSession
) -> None:
    await create(http, service, filter={"resource": "vm", "subResources": ["nic"]})
    committed = await commit(service, "a", 5)
    await commit(service, "b", 2, sub="alias")  # not for this filter
    first = await fetch(http, service, count=3)
    assert cursors(first) == committed[:3] and first["pending"] == 3
    assert [m["deliveries"] for m in first["messages"]] == [1, 1, 1]
    assert first["messages"][0]["data"]["value"]["changedResourceId"] == "a/000"
    second = await fetch(http, service)
    assert cursors(second) == committed[3:] and second["pending"] == 5
    results = await settle(http, service, "ack", deliveries(first) + deliveries(second))
    assert [r["outcome"] for r in results] == ["applied"] * 5
    assert all(r["applied"] and not r["late"] for r in results)
    again = await settle(http, service, "ack", deliveries(first)[:1])
    assert again == [{"delivery": deliveries(first)[0], "applied": False,
                      "outcome": "not_pending", "late": False}]
    assert (await fetch(http, service))["messages"] == []
    _status, info = await call(http, service, "GET", f"{BASE}/billing")
    assert info["pending"] == 0 and info["counts"]["acked"] == 5
    assert info["position"] >= committed[-1]


async def test_fetch_waits_for_a_new_item_and_returns_as_soon_as_it_is_committed(
    service: Service, http: aiohttp.ClientSession
) -> None:
    await commit(service, "old", 2)  # before the consumer: not for it
    await create(http, service, start="last")
    waiting = asyncio.create_task(fetch(http, service, wait=scaled(10)))
    await asyncio.sleep(0)
    [cursor] = await commit(service, "new", 1)
    reply = await asyncio.wait_for(waiting, scaled(5))
    assert cursors(reply) == [cursor]


async def test_fetch_with_wait_returns_empty_after_the_wait(
    service: Service, http: aiohttp.ClientSession
) -> None:
    await create(http, service)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await fetch(http, service, wait=0.3))["messages"] == []
    assert loop.time() - started >= 0.29


async def test_concurrent_fetches_never_hand_out_the_same_item(
    service: Service, http: aiohttp.ClientSession
) -> None:
    await create(http, service, max_ack_pending=50)
    committed = await commit(service, "c", 40)
    replies = await asyncio.gather(*(fetch(http, service, count=7) for _ in range(8)))
    handed = [c for reply in replies for c in cursors(reply)]
    assert sum(1 for reply in replies if reply["messages"]) >= 2
    handed += cursors(await fetch(http, service))  # what lost every race, if any
    assert sorted(handed) == committed  # each once, none twice


async def test_max_ack_pending_holds_new_items_back_until_acks_make_room(
    service: Service, http: aiohttp.ClientSession
) -> None:
    await create(http, service, max_ack_pending=3)
    committed = await commit(service, "p", 5)
    first = await fetch(http, service, count=10)
    assert cursors(first) == committed[:3] and first["pending"] == 3
    assert (await fetch(http, service))["messages"] == []
    await settle(http, service, "ack", deliveries(first)[:1])
    assert cursors(await fetch(http, service)) == committed[3:4]


# --- redelivery, nak, in_progress, term, max deliveries ---------------------------------------


async def test_an_unacked_item_is_handed_out_again_after_the_ack_wait_and_the_old_delivery_is_stale(
    service: Service, http: aiohttp.ClientSession
) -> None:
    await create(http, service, ack_wait=0.3)
    [cursor] = await commit(service, "r", 1)
    first = await fetch(http, service)
    loop = asyncio.get_running_loop()
    started = loop.time()
    second = await fetch(http, service, wait=scaled(5))  # waits for the ack wait to pass
    assert loop.time() - started >= 0.25
    assert cursors(second) == [cursor] and second["messages"][0]["deliveries"] == 2
    [stale] = await settle(http, service, "ack", deliveries(first))
    assert stale["outcome"] == "redelivered" and not stale["applied"]
    [done] = await settle(http, service, "ack", deliveries(second))
    assert done["applied"]
    _status, info = await call(http, service, "GET", f"{BASE}/billing")
    assert info["counts"]["redelivered"] == 1 and info["counts"]["acked"] == 1


async def test_a_late_ack_before_any_redelivery_takes_effect_and_says_it_was_late(
    service: Service, http: aiohttp.ClientSession
) -> None:
    await create(http, service, ack_wait=0.1)
    await commit(service, "l", 1)
    first = await fetch(http, service)
    # Let the ack wait pass on a long poll of another consumer, that nothing ends early.
    await create(http, service, name="audit", start="last")
    await fetch(http, service, name="audit", wait=0.2)
    [late] = await settle(http, service, "ack", deliveries(first))
    assert late["applied"] and late["late"]


async def test_nak_with_a_delay_hands_the_item_out_again_after_the_delay(
    service: Service, http: aiohttp.ClientSession
) -> None:
    await create(http, service, ack_wait=30)
    [cursor] = await commit(service, "n", 1)
    first = await fetch(http, service)
    loop = asyncio.get_running_loop()
    [nakked] = await settle(http, service, "nak", deliveries(first), delay=0.4)
    assert nakked["applied"]
    started = loop.time()
    assert (await fetch(http, service))["messages"] == []  # not before the delay
    second = await fetch(http, service, wait=scaled(5))
    assert loop.time() - started >= 0.35
    assert cursors(second) == [cursor] and second["messages"][0]["deliveries"] == 2
    [immediate] = await settle(http, service, "nak", deliveries(second))
    assert immediate["applied"]
    third = await fetch(http, service)
    assert cursors(third) == [cursor] and third["messages"][0]["deliveries"] == 3


async def test_in_progress_extends_the_ack_wait(
    service: Service, http: aiohttp.ClientSession
) -> None:
    # Each round (a long poll of a quarter of the ack wait, then in_progress) leaves three
    # quarters of the ack wait for the two requests, so a loaded machine does not make it late.
    ack_wait = scaled(1.0)
    await create(http, service, ack_wait=ack_wait)
    await commit(service, "w", 1)
    first = await fetch(http, service)
    loop = asyncio.get_running_loop()
    started = loop.time()
    while loop.time() - started < 2.5 * ack_wait:  # more than twice the ack wait
        assert (await fetch(http, service, wait=ack_wait / 4))["messages"] == []
        [working] = await settle(http, service, "in_progress", deliveries(first))
        assert working["applied"] and not working["late"]
    [done] = await settle(http, service, "ack", deliveries(first))
    assert done["applied"] and not done["late"]


async def test_after_max_deliveries_the_item_goes_to_the_dead_letter_record(
    service: Service, http: aiohttp.ClientSession
) -> None:
    await create(http, service, max_deliver=2)
    [poison, fine] = await commit(service, "d", 2)
    first = await fetch(http, service)
    assert cursors(first) == [poison, fine]
    await settle(http, service, "ack", deliveries(first)[1:])
    await settle(http, service, "nak", deliveries(first)[:1])
    second = await fetch(http, service)
    assert cursors(second) == [poison] and second["messages"][0]["deliveries"] == 2
    await settle(http, service, "nak", deliveries(second))
    third = await fetch(http, service)
    assert third["messages"] == [] and third["dead_lettered"] == 1 and third["pending"] == 0
    [late] = await settle(http, service, "ack", deliveries(second))
    assert late["outcome"] == "not_pending"
    status, dead = await call(http, service, "GET", f"{BASE}/billing/dead")
    assert status == 200 and dead["more"] is False and dead["dropped"] == 0
    [record] = dead["records"]
    assert record["reason"] == "max_deliveries" and record["cursor"] == poison
    assert record["deliveries"] == 2 and record["item"]["changedResourceId"] == "d/000"
    status, info = await call(http, service, "GET", f"{BASE}/billing")
    assert info["counts"]["dead_lettered"] == 1 and info["dead_letters"]["kept"] == 1


async def test_term_dead_letters_the_item_at_once(
    service: Service, http: aiohttp.ClientSession
) -> None:
    await create(http, service)
    [cursor] = await commit(service, "t", 1)
    first = await fetch(http, service)
    [termed] = await settle(http, service, "term", deliveries(first))
    assert termed["applied"]
    assert (await fetch(http, service))["messages"] == []
    _status, dead = await call(http, service, "GET", f"{BASE}/billing/dead")
    assert [(r["reason"], r["cursor"]) for r in dead["records"]] == [("terminated", cursor)]


async def test_the_dead_letter_record_is_bounded_and_says_how_many_it_dropped(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory, http: aiohttp.ClientSession,
) -> None:
    config = make_config(redis_server.url, durable={"consumers": ["billing"], "maxDeadLetters": 3})
    async with start_publisher(config) as service:
        await create(http, service)
        committed = await commit(service, "b", 5)
        await settle(http, service, "term", deliveries(await fetch(http, service)))
        _status, dead = await call(http, service, "GET", f"{BASE}/billing/dead?limit=2")
        assert [r["cursor"] for r in dead["records"]] == committed[2:4]
        assert dead["more"] is True and dead["dropped"] == 2
        _status, rest = await call(
            http, service, "GET", f"{BASE}/billing/dead?after={dead['records'][-1]['id']}"
        )
        assert [r["cursor"] for r in rest["records"]] == committed[4:] and not rest["more"]


async def test_deliveries_of_a_deleted_consumer_are_refused_as_of_an_earlier_consumer(
    service: Service, http: aiohttp.ClientSession
) -> None:
    await create(http, service)
    await commit(service, "x", 1)
    first = await fetch(http, service)
    await call(http, service, "DELETE", f"{BASE}/billing")
    await create(http, service)
    [result] = await settle(http, service, "ack", deliveries(first))
    assert result["outcome"] == "consumer_recreated" and not result["applied"]
    assert cursors(await fetch(http, service)) == cursors(first)  # the new one starts afresh


# --- trimming, restarts, Redis down -------------------------------------------------------------


async def test_items_trimmed_before_they_were_read_are_a_gap_in_the_dead_letter_record(
    service: Service, http: aiohttp.ClientSession
) -> None:
    await create(http, service)
    committed = await commit(service, "g", 6)
    handed = await fetch(http, service, count=2)  # copied: a trim cannot lose them now
    assert await service.bucket.log.trim(None, max_items=2) == 4
    reply = await fetch(http, service)
    assert cursors(reply) == committed[4:] and reply["dead_lettered"] == 1
    _status, dead = await call(http, service, "GET", f"{BASE}/billing/dead")
    [gap] = dead["records"]
    assert gap["reason"] == "trimmed" and gap["after"] == committed[1]
    assert gap["through"] == committed[3]
    await settle(http, service, "nak", deliveries(handed))
    again = await fetch(http, service)  # trimmed from the log, handed out again all the same
    assert cursors(again) == committed[:2]
    assert again["messages"][0]["data"]["value"]["changedResourceId"] == "g/000"


async def test_a_publisher_restart_keeps_the_position_and_the_pending_items(
    durable_config: Config, start_publisher: PublisherFactory, http: aiohttp.ClientSession
) -> None:
    async with start_publisher(durable_config) as service:
        await create(http, service, ack_wait=0.3)
        committed = await commit(service, "s", 4)
        first = await fetch(http, service, count=2)
        await settle(http, service, "ack", deliveries(first)[:1])
    async with start_publisher(durable_config) as service:
        reply = await fetch(http, service, count=10, wait=scaled(5))
        got = cursors(reply)
        if committed[1] not in got:  # the unacked one comes back once its ack wait passed
            got += cursors(await fetch(http, service, count=10, wait=scaled(5)))
        assert sorted(got) == committed[1:]
        _status, info = await call(http, service, "GET", f"{BASE}/billing")
        assert info["counts"]["acked"] == 1 and info["counts"]["delivered"] == 4


async def test_redis_down_is_a_503_and_nothing_is_lost(
    tcp_redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory, http: aiohttp.ClientSession,
) -> None:
    config = make_config(tcp_redis_server.url, durable={"consumers": ["billing"]})
    async with start_publisher(config) as service:
        await create(http, service)
        committed = await commit(service, "u", 2)
        first = await fetch(http, service, count=1)
        tcp_redis_server.stop()
        status, error = await call(http, service, "POST", f"{BASE}/billing/fetch", {})
        assert status == 503 and error["code"] == "BucketUnavailable"
        status, error = await call(http, service, "POST", f"{BASE}/billing/ack",
                                   {"deliveries": deliveries(first)})
        assert status == 503 and error["code"] in ("BucketUnavailable", "OutcomeUnknown")
        status, error = await call(http, service, "GET", f"{BASE}/billing")
        assert status == 503
        tcp_redis_server.start()
        [result] = await settle(http, service, "ack", deliveries(first))
        assert result["applied"]
        assert cursors(await fetch(http, service)) == committed[1:]


async def test_the_bucket_recreated_is_recorded_and_the_consumer_reads_the_new_log(
    service: Service, http: aiohttp.ClientSession
) -> None:
    await create(http, service)
    old = await commit(service, "e", 2)
    await settle(http, service, "ack", deliveries(await fetch(http, service, count=1)))
    for key in (service.bucket.keys.epoch, service.bucket.keys.last, service.bucket.keys.log):
        await service.bucket.redis.delete(key)
    new = await commit(service, "f", 2)
    assert Position.decode(new[0]).epoch != Position.decode(old[0]).epoch
    reply = await fetch(http, service)
    assert cursors(reply) == new and reply["dead_lettered"] == 1
    _status, dead = await call(http, service, "GET", f"{BASE}/billing/dead")
    [record] = dead["records"]
    assert record["reason"] == "epoch" and record["after"] == old[0]


# --- access --------------------------------------------------------------------------------------


async def test_a_token_may_use_only_the_durable_consumers_its_scopes_name(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory, http: aiohttp.ClientSession,
) -> None:
    import hashlib

    token = "billing-token-0123456789"
    config = make_config(
        redis_server.url, durable={"consumers": ["billing", "audit"]},
        auth={"tokens": [{"name": "billing", "sha256": hashlib.sha256(token.encode()).hexdigest(),
                          "scopes": ["durable:billing"]}]},
    )
    headers = {"Authorization": f"Bearer {token}"}
    async with start_publisher(config) as service:
        status, _ = await call(http, service, "PUT", f"{BASE}/billing", {}, headers=headers)
        assert status == 201
        status, error = await call(http, service, "PUT", f"{BASE}/audit", {}, headers=headers)
        assert status == 403 and "durable:audit" in error["message"]
        status, error = await call(http, service, "GET", BASE, headers=headers)
        assert status == 403 and "durable:*" in error["message"]
        status, error = await call(http, service, "PUT", f"{BASE}/billing", {})
        assert status == 401


async def test_durable_consumers_are_refused_unless_config_js_names_them(
    publisher: Service, http: aiohttp.ClientSession
) -> None:
    status, error = await call(http, publisher, "PUT", f"{BASE}/billing", {})
    assert status == 403 and error["code"] == "UnknownConsumer"


# --- config.js -----------------------------------------------------------------------------------


def _config_text(durable: str, scopes: str = '["events"]') -> str:
    return (
        "module.exports = {resources: [{resource: 'vm', subResources: ['nic'], "
        "bootstrapRoute: '/vms'}], " + durable + ", auth: {tokens: [{name: 'b', sha256: '"
        + "a" * 64 + "', scopes: " + scopes + "}]}};"
    )


def test_the_durable_section_of_config_js_and_its_scopes() -> None:
    from changefeed.errors import ConfigError
    from publisher.config.settings import parse_config

    parsed = parse_config(_config_text(
        "durable: {consumers: ['billing'], maxAckPending: 10, maxAckWait: 60, maxDeadLetters: 5}",
        '["durable:billing", "durable:*"]',
    ))
    assert parsed.durable.consumers == frozenset({"billing"})
    assert (parsed.durable.max_ack_pending, parsed.durable.max_ack_wait,
            parsed.durable.max_dead_letters) == (10, 60.0, 5)
    assert parse_config(_config_text("durable: {}")).durable.consumers == frozenset()
    with pytest.raises(ConfigError, match=r"durable\.consumers"):
        parse_config(_config_text("durable: {consumers: ['billing']}", '["durable:audit"]'))
    with pytest.raises(ConfigError, match=r"durable\.colour"):
        parse_config(_config_text("durable: {colour: 1}"))
    with pytest.raises(ConfigError, match=r"durable\.consumers"):
        parse_config(_config_text("durable: {consumers: ['no spaces']}"))


async def test_a_filter_on_ids_and_prefixes_hands_out_only_what_it_watches(
    service: Service, http: aiohttp.ClientSession
) -> None:
    await create(http, service, filter={"resource": "vm", "ids": ["exact"],
                                        "prefixes": ["servers"]})
    wanted = [await service.bucket.commit("vm", id, ["nic"], {}) for id in ("servers/1", "exact")]
    for id in ("serversX", "other", "exactly"):
        await service.bucket.commit("vm", id, ["nic"], {})
    await service.bucket.commit("network", "servers/2", ["ips"], {})
    reply = await fetch(http, service)
    assert cursors(reply) == wanted
    status, info = await call(http, service, "GET", f"{BASE}/billing")
    assert status == 200 and info["position"] > wanted[-1]  # read past what it skipped
