"""Bad input is a 4xx with the usual JSON error, never a 5xx: the reported cases one by one, then
arbitrary query strings and bodies (hypothesis) at every route of a real publisher process."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, quote_from_bytes, urlsplit

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changefeed import feed, longpoll
from publisher.bucket import ChangeBucket, connect
from publisher.config.settings import load_config
from tests.servers import PublisherProcess, RedisServer, scaled, write_config

PARTITIONS = 2
CONSUMER = "billing"


@dataclass
class Target:
    host: str
    port: int
    empty_cursor: str
    """The cursor a bootstrap page gives on an empty bucket (position 0-0)."""
    cursors: list[str]

    def request(
        self, method: str, target: str, body: bytes | None = None
    ) -> tuple[int, bytes, str]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=scaled(10))
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, target, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read(), response.getheader("Content-Type") or ""
        finally:
            conn.close()


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    redis = RedisServer(tmp_path_factory.mktemp("redis")).start()
    path = write_config(
        tmp_path_factory.mktemp("config") / "config.js",
        redis.url,
        bucket={"redisUrl": redis.url, "name": "test", "partitions": PARTITIONS},
        limits={"wait": 0.01, "maxWait": 0.05},
        feed={"consumers": [CONSUMER]},
    )
    publisher = PublisherProcess(path).start()
    try:
        parts = urlsplit(publisher.url)
        assert parts.hostname and parts.port
        target = Target(parts.hostname, parts.port, "", [])
        status, body, _ = target.request("GET", "/vms")
        assert status == 200, body
        target.empty_cursor = orjson.loads(body)["cursor"]
        target.cursors = asyncio.run(_publish(redis.url, path))
        yield target
    finally:
        publisher.stop()
        redis.stop()


async def _publish(url: str, path: Any) -> list[str]:
    config = load_config(path)
    bucket = ChangeBucket(connect(url), "test", config.resources, PARTITIONS)
    try:
        return await bucket.publish_many(
            ("vm" if i % 2 else "network", f"servers/{i}", ["nic" if i % 2 else "ips"])
            for i in range(6)
        )
    finally:
        await bucket.aclose()


def _assert_client_error(status: int, body: bytes, content_type: str) -> None:
    assert 400 <= status < 500, (status, body[:300])
    assert content_type.startswith("application/json"), (content_type, body[:300])
    error = orjson.loads(body)
    assert error["code"] and error["message"], error


@pytest.mark.parametrize(
    "target_path",
    [
        "/vms?limit=%C2%B2",
        "/changefeeds/feed/v1?n=%C2%B2&cursor0=_first",
        "/changefeeds/feed/v1?n=2&cursor0=_first&pagesizehint=%C2%B2",
        "/changefeeds/feed/v1?n=2&resume=%C2%B2&cursorset=main&consumer=billing",
        "/changefeeds/events?max_results=%C2%B2",
        "/changefeeds/events?wait_time=%C2%B2",
    ],
)
def test_unicode_digits_are_400(target: Target, target_path: str) -> None:
    _assert_client_error(*target.request("GET", target_path))


def test_before_the_empty_bucket_cursor_is_empty_not_500(target: Target) -> None:
    """The cursor handed out on an empty bucket is position 0-0: nothing is before it."""
    status, body, _ = target.request("GET", f"/changefeeds/events?before={target.empty_cursor}")
    assert status == 200, body
    assert orjson.loads(body)["items"] == []
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "events",
           "params": {"before": target.empty_cursor, "order": "oldest"}}
    status, body, _ = target.request("POST", "/changefeeds/rpc", orjson.dumps(rpc))
    assert status == 200 and orjson.loads(body)["result"]["items"] == [], body


# --- arbitrary input ---------------------------------------------------------------------------

PATHS = [
    "/changefeeds", "/changefeeds/stats", "/vms", "/vms/servers/1", "/networks", "/networks/x",
    "/changefeeds/events", "/changefeeds/feed/v1", "/changefeeds/rpc", "/nope", "/vms/%C2%B2",
]
NAMES = sorted(
    {"limit", "marker", "id", "prefix", *longpoll.QUERY_PARAMETERS, *feed.PARAMETERS,
     "cursor0", "cursor1", "cursor2", "cursor99999999999999999999"}
)
WORDS = [
    "", " ", "0", "1", "-1", "2", "²", "\u0661", "99999999999999999999", "1e3", "0x10", "5s",
    "500ms",
    "1m", "-5s", "nan", "inf", "_first", "_last", "_all", "ce_id,ce_time", "oldest", "newest",
    "vm", "network", "nic", "*", "/", "//", "servers", "servers/1", CONSUMER, "main", "0,1",
    "0,0,1", "1,9", "%", "\x00", "a" * 600, "k2v9q4xa.zz", "dXVpZC0y", "=",
]


def _values(target: Target) -> st.SearchStrategy[str]:
    special = [*WORDS, target.empty_cursor, *target.cursors]
    return st.one_of(
        st.sampled_from(special),
        st.text(max_size=24),
        st.integers(min_value=-(10**20), max_value=10**20).map(str),
    )


def _query(pairs: list[tuple[str, str]]) -> str:
    return "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in pairs)


FAST = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FAST
@given(data=st.data())
def test_arbitrary_query_strings_never_5xx(target: Target, data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(PATHS), "path")
    names = st.one_of(st.sampled_from(NAMES), st.text(max_size=12))
    pairs = data.draw(st.lists(st.tuples(names, _values(target)), max_size=7), "query")
    raw = data.draw(st.binary(max_size=16), "raw bytes")
    query = _query(pairs) + (f"&{quote_from_bytes(raw)}={quote_from_bytes(raw)}" if raw else "")
    method = data.draw(st.sampled_from(["GET", "GET", "GET", "HEAD", "POST", "DELETE"]), "method")
    status, body, _ = target.request(method, f"{path}?{query}")
    assert status < 500, (method, path, query, status, body[:300])


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                               max_size=3),
    max_leaves=8,
)


def _rpc_calls(target: Target) -> st.SearchStrategy[Any]:
    value = st.one_of(_values(target), JSON)
    filters = st.dictionaries(
        st.sampled_from([*longpoll.FILTER_KEYS, "query"]),
        st.one_of(value, st.lists(_values(target), max_size=3)),
        max_size=4,
    )
    params = st.dictionaries(
        st.sampled_from([*longpoll.PARAMS, "colour"]), st.one_of(value, filters), max_size=6
    )
    call = st.fixed_dictionaries(
        {"jsonrpc": st.sampled_from(["2.0", "2.0", "1.0", 2]),
         "method": st.sampled_from(["events", "events", "subscribe", 5])},
        optional={"id": st.one_of(st.integers(), st.text(max_size=5), st.none(), JSON),
                  "params": st.one_of(params, JSON)},
    )
    return st.one_of(call, st.lists(call, max_size=2), JSON)


@FAST
@given(data=st.data())
def test_arbitrary_rpc_bodies_never_5xx(target: Target, data: st.DataObject) -> None:
    call = data.draw(_rpc_calls(target), "call")
    body = json.dumps(call).encode()  # not orjson: integers past 64 bits must get through
    if data.draw(st.booleans(), "mangle"):
        body = body[: data.draw(st.integers(0, len(body)), "cut")] + data.draw(st.binary(
            max_size=8), "tail")
    status, reply, _ = target.request("POST", "/changefeeds/rpc", body)
    assert status < 500, (call, status, reply[:300])
