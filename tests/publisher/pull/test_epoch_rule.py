"""The rule of every read path (docs/architecture.md, "One rule for every read path"): the epoch
is read in the same snapshot as the entries served, and nothing of a new epoch goes out under
the old one's cursors. A failpoint begins a new epoch just after a path read the old one (as a
failover's renewal by another publisher would, between two of its reads)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from changefeed.cursor import Position
from publisher.bucket import Log
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.failpoint import ThenOnce
from tests.servers import RedisServer


@pytest.fixture
async def service(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> AsyncIterator[Service]:
    async with start_publisher(make_config(redis_server.url)) as service:
        for n in range(5):
            await service.bucket.publish("vm", f"vm{n}", ["nic"])
        yield service


def _renew_after_the_epoch_is_read(
    monkeypatch: pytest.MonkeyPatch, service: Service, epoch: str
) -> ThenOnce:
    async def renew() -> None:
        await service.bucket.log.renew_epoch(epoch)

    return ThenOnce(monkeypatch, Log, "retentions", renew)


def _epochs(items: list[dict[str, Any]]) -> set[str]:
    return {Position.decode(item["cursor"]).epoch for item in items}


async def test_events_serves_nothing_of_a_new_epoch_under_the_old_ones_cursors(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = await service.bucket.log.current_epoch()
    assert old is not None
    failpoint = _renew_after_the_epoch_is_read(monkeypatch, service, old)
    async with aiohttp.ClientSession() as http, http.get(
        service.url + "/changefeeds/events", params={"order": "oldest", "wait_time": "0"}
    ) as reply:
        body = await reply.json()
    assert failpoint.fired
    new = await service.bucket.log.current_epoch()
    assert new != old
    assert len(body["items"]) == 5 and _epochs(body["items"]) == {new}, body


async def test_json_rpc_serves_nothing_of_a_new_epoch_under_the_old_ones_cursors(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = await service.bucket.log.current_epoch()
    assert old is not None
    async with aiohttp.ClientSession() as http:
        params = {"order": "oldest", "wait_time": 0}
        call = {"jsonrpc": "2.0", "id": 1, "method": "events", "params": params}
        async with http.post(service.url + "/changefeeds/rpc", json=call) as reply:
            first = (await reply.json())["result"]["items"]
        failpoint = _renew_after_the_epoch_is_read(monkeypatch, service, old)
        call["params"] = {"after": first[1]["cursor"], "order": "oldest", "wait_time": 0}
        async with http.post(service.url + "/changefeeds/rpc", json=call) as reply:
            body = (await reply.json())["result"]
    assert failpoint.fired
    new = await service.bucket.log.current_epoch()
    # Told first: the cursor's entry is in the new epoch's history, so its position there.
    assert body["items"] == [] and body["missed"] is True, body
    assert Position.decode(body["resume_after"]).epoch == new


async def test_the_feed_answers_410_when_the_epoch_changes_between_its_reads(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = await service.bucket.log.current_epoch()
    assert old is not None
    async with aiohttp.ClientSession() as http:
        async with http.get(service.url + "/changefeeds/feed/v1",
                            params={"n": "1", "cursor0": "_first", "pagesizehint": "2"}) as reply:
            lines = (await reply.read()).splitlines()
        assert reply.status == 200 and lines
        failpoint = _renew_after_the_epoch_is_read(monkeypatch, service, old)
        async with http.get(service.url + "/changefeeds/feed/v1",
                            params={"n": "1", "cursor0": "_first"}) as reply:
            status, body = reply.status, await reply.json()
    assert failpoint.fired
    assert status == 410 and body["code"] == "CursorGone", body
