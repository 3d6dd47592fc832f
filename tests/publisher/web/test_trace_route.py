"""The delivery trace on real servers (issue 17, item 6): two publishers on one bucket with
listeners of two services each, `changefeed trace` as a subprocess, the route's 400 and 404
answers, the scope it needs, catching-up listeners, and turning it off."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from changefeed.cursor import Position
from publisher.bucket import ChangeBucket, connect
from publisher.config.settings import Config, Trace, load_config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.pki import sha256_hex
from tests.publisher.cli.test_cli import changefeed
from tests.publisher.web.test_fleet import wait_for_fleet
from tests.servers import PublisherProcess, RedisServer, scaled, write_config
from tests.wsclient import Feed, register, v1, v2

FAST = {"interval": 0.2, "ttl": 2}


async def get(url: str, token: str | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=scaled(10))
    async with aiohttp.ClientSession(timeout=timeout) as http, http.get(
        url, headers=headers
    ) as response:
        assert response.content_type == "application/json", await response.text()
        return response.status, await response.json()


async def listeners(service: Service, tcns: int, napi: int) -> list[Feed]:
    """`tcns` v1 listeners (service tcns) and `napi` v2 ones (service napi) of vm nic, and one
    of vm alias that the test's change is not for."""
    feeds = [await register(service.ws_url, v1("vm", ["nic"], instance=f"t{i}"))
             for i in range(tcns)]
    feeds += [await register(service.ws_url, v2({"vm": ["nic"]}, instance=f"n{i}"), "~2")
              for i in range(napi)]
    feeds.append(await register(service.ws_url, v1("vm", ["alias"], instance="other")))
    return feeds


async def test_trace_shows_both_publishers_reads_and_writes_by_service(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url, fleet=FAST)
    async with start_publisher(config) as a, start_publisher(config) as b:
        on_a = await listeners(a, tcns=2, napi=1)
        on_b = await listeners(b, tcns=1, napi=3)
        await wait_for_fleet(
            a.url, lambda body: sorted(p.get("url") for p in body["publishers"])
            == sorted([a.url, b.url]), "both publishers advertise their address")
        cursor = await a.bucket.publish("vm", "vm-1", ["nic"])
        # What the listeners received: every nic listener has it, the alias one nothing.
        for feed in on_a[:-1] + on_b[:-1]:
            assert (await feed.next())["cursor"] == cursor
        assert await on_a[-1].quiet(0.1) and await on_b[-1].quiet(0.1)

        status, output = await changefeed("trace", cursor, "--url", a.url, "--json")
        assert status == 0, output
        body = orjson.loads(output)
        assert body["unreached"] == {}
        by_id = {p["publisher"]: p for p in body["publishers"]}
        assert set(by_id) == {a.id, b.id}
        for service, (tcns, napi) in ((a, (2, 1)), (b, (1, 3))):
            answer = by_id[service.id]
            assert answer["status"] == 200 and answer["address"] == service.url
            assert {s: w["listeners"] for s, w in answer["services"].items()} == {
                "tcns": tcns, "napi": napi}
            assert answer["listeners"] == tcns + napi
            assert answer["readMs"] >= -50  # read after the commit (clock skew: none here)
            assert answer["readAt"] <= answer["services"]["tcns"]["firstWrite"]
            assert answer["committedAt"] == body["committedAt"]

        status, text = await changefeed("trace", cursor, "--url", b.url)
        assert status == 0, text
        assert f"publisher {a.id} ({a.url})" in text and f"publisher {b.id} ({b.url})" in text
        assert "committed  " in text and "read       " in text
        assert "written to 7 listener(s) by 2 of 2 publisher(s)" in text
        assert any(line.split()[:2] == ["napi", "3"] for line in text.splitlines())

        status, text = await changefeed("trace", cursor, "--url", b.url, "--this-publisher")
        assert status == 0 and a.id not in text
        assert "written to 4 listener(s) by 1 of 1 publisher(s)" in text
        for feed in on_a + on_b:
            await feed.close()


async def test_outside_the_window_and_bad_cursors(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url, fleet=FAST, trace={"items": 2, "maxAge": 600})
    async with start_publisher(config) as service:
        feed = await register(service.ws_url, v1("vm", ["nic"]))
        cursors = [await service.bucket.publish("vm", f"vm-{i}", ["nic"]) for i in range(4)]
        assert [i["cursor"] for i in await feed.take(4)] == cursors
        status, body = await get(f"{service.url}/changefeeds/trace/{cursors[0]}")
        assert status == 404 and body["code"] == "NotTraced"
        assert body["message"] == "not traced: older than the trace window of 2 changes / 600 s"
        assert body["window"] == {"items": 2, "maxAge": 600.0, "held": 2, "oldest": cursors[2]}
        assert body["publisher"] == service.id
        status, body = await get(f"{service.url}/changefeeds/trace/{cursors[3]}")
        assert status == 200 and body["services"]["tcns"]["listeners"] == 1

        ahead = Position.decode(cursors[3])
        later = Position.single(ahead.epoch, dataclasses.replace(ahead.position,
                                                        ms=ahead.position.ms + 60_000))
        status, body = await get(f"{service.url}/changefeeds/trace/{later.encode()}")
        assert status == 404 and body["code"] == "NotReadYet"
        for path, code in (("/changefeeds/trace/not-a-cursor", "InvalidCursor"),
                           ("/changefeeds/trace", "InvalidCursor"),
                           (f"/changefeeds/trace/{cursors[3]}?x=1", "InvalidQuery")):
            status, body = await get(service.url + path)
            assert (status, body["code"]) == (400, code), (path, body)

        status, text = await changefeed("trace", cursors[0], "--url", service.url)
        assert status == 1, text
        assert "not traced: older than the trace window of 2 changes / 600 s" in text
        assert "no publisher has a trace of this change" in text
        status, text = await changefeed("trace", "garbage", "--url", service.url)
        assert status == 2 and "Invalid value for CURSOR: invalid cursor 'garbage'" in text
        await feed.close()


async def test_a_listener_catching_up_is_counted_when_it_is_written(
    publisher: Service,
) -> None:
    first = await register(publisher.ws_url, v1("vm", ["nic"]))
    since = first.reply["cursor"]
    cursor = await publisher.bucket.publish("vm", "vm-1", ["nic"])
    assert (await first.next())["cursor"] == cursor
    # Registered after the change, resuming from before it: sent it from the window.
    late = await register(publisher.ws_url, v2({"vm": ["nic"]}, since=since), "~2")
    assert late.reply["resumed"] is True
    assert (await late.next())["cursor"] == cursor
    status, body = await get(f"{publisher.url}/changefeeds/trace/{cursor}")
    assert status == 200
    napi, tcns = body["services"]["napi"], body["services"]["tcns"]
    assert (tcns["listeners"], napi["listeners"]) == (1, 1)
    assert napi["firstWrite"] >= tcns["lastWrite"]
    await first.close()
    await late.close()


async def test_the_trace_needs_the_stats_scope(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory, tmp_path: Path,
) -> None:
    tokens = {"ops": "o" * 32, "tcns": "t" * 32}
    config = make_config(redis_server.url, auth={"tokens": [
        {"name": "ops", "sha256": sha256_hex(tokens["ops"]), "scopes": ["stats"]},
        {"name": "tcns", "sha256": sha256_hex(tokens["tcns"]), "scopes": ["listen:vm"]},
    ]})
    async with start_publisher(config) as service:
        cursor = await service.bucket.publish("vm", "vm-1", ["nic"])
        url = f"{service.url}/changefeeds/trace/{cursor}"
        status, body = await get(url)
        assert status == 401 and body["code"] == "Unauthorized"
        status, body = await get(url, tokens["tcns"])
        assert status == 403 and "lacks the scope stats" in body["message"]
        status, body = await get(url, tokens["ops"])
        assert status in (200, 404) and body["publisher"] == service.id
        token_file = tmp_path / "token"
        token_file.write_text(tokens["tcns"])
        status, text = await changefeed("trace", cursor, "--url", service.url,
                                        "--token-file", str(token_file))
        assert status == 1 and "HTTP 403" in text and "stats scope" in text


async def test_trace_off_and_on_again_by_reload(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url, trace={"items": 0})
    assert config.trace == Trace(0, 600.0)
    async with start_publisher(config) as service:
        cursor = await service.bucket.publish("vm", "vm-1", ["nic"])
        status, body = await get(f"{service.url}/changefeeds/trace/{cursor}")
        assert status == 404 and body["code"] == "TraceDisabled"
        assert service.reload(make_config(redis_server.url, trace={"items": 5})) == []
        feed = await register(service.ws_url, v1("vm", ["nic"]))
        cursor = await service.bucket.publish("vm", "vm-2", ["nic"])
        assert (await feed.next())["cursor"] == cursor
        status, body = await get(f"{service.url}/changefeeds/trace/{cursor}")
        assert status == 200 and body["listeners"] == 1
        assert body["window"]["items"] == 5
        await feed.close()


async def test_trace_reaches_workers_that_share_a_port(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    config = write_config(tmp_path / "workers.js", redis_server.url,
                          fleet={"interval": 0.2, "ttl": 2})
    parent = PublisherProcess(config, "--workers", "2")
    await asyncio.to_thread(parent.start)
    bucket = ChangeBucket(connect(redis_server.url), "test", load_config(config).resources)
    try:
        # Both tails started (a position) before the commit: a tail that starts after it
        # starts past it, and never reads or traces it.
        await wait_for_fleet(
            parent.url, lambda body: sorted(p.get("url") for p in body["publishers"])
            == [parent.url] * 2 and all(p["tail"]["position"] for p in body["publishers"]),
            "both workers advertise the one URL, their tails started")
        cursor = await bucket.publish("vm", "vm-1", ["nic"])
        body = await wait_for_fleet(
            parent.url, lambda body: all((p["tail"]["position"] or "") >= cursor
                                         for p in body["publishers"]),
            "both workers' tails read the change")
        workers = {p["publisher"] for p in body["publishers"]}
        status, output = await changefeed("trace", cursor, "--url", parent.url, "--json")
        assert status == 0, output
        answer = orjson.loads(output)
        assert answer["unreached"] == {}
        assert {p["publisher"] for p in answer["publishers"]} == workers
        assert all(p["status"] == 200 and p["listeners"] == 0 for p in answer["publishers"]), output
    finally:
        await bucket.aclose()
        await asyncio.to_thread(parent.stop)
