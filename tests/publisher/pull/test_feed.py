"""The ZeroEventHub feed (NDJSON, partitions, checkpoints, cursorset) on a real publisher."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from changefeed.cursor import Position
from publisher.bucket import partition_of
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.publisher.layouts import own
from tests.servers import eventually, scaled

N = 4


class Client:
    def __init__(self, service: Service, http: aiohttp.ClientSession) -> None:
        self.service = service
        self.http = http

    async def raw(self, params: dict[str, Any]) -> tuple[int, bytes]:
        async with self.http.get(self.service.url + "/changefeeds/feed/v1", params=params) as r:
            return r.status, await r.read()

    async def read(self, **params: Any) -> tuple[list[dict[str, Any]], dict[int, str]]:
        """The event lines and the checkpoints of one response."""
        status, body = await self.raw({"n": N, **params})
        assert status == 200, body
        events, checkpoints = [], {}
        for line in body.splitlines():
            record = orjson.loads(line)
            if "cursor" in record:
                checkpoints[record["partition"]] = record["cursor"]
            else:
                events.append(record)
        return events, checkpoints

    async def error(self, params: dict[str, Any]) -> tuple[int, str]:
        status, body = await self.raw(params)
        return status, orjson.loads(body)["message"]

    async def publish(self, *ids: str) -> list[str]:
        """The cursors the feed gives these changes: a position of their partition's log (a
        commit's cursor is composite on a bucket in a Redis Cluster)."""
        cursors = await self.service.bucket.publish_many(("vm", id, ["nic"]) for id in ids)
        return [
            Position.single(Position.decode(c).epoch, own(c, id)[1]).encode()
            for c, id in zip(cursors, ids, strict=True)
        ]


@pytest.fixture
async def client(
    layout_config: Callable[..., Config], start_publisher: PublisherFactory
) -> AsyncIterator[Client]:
    """A feed client of a publisher on a bucket of N partitions, on each layout."""
    cursorsets = {"consumers": ["billing", "other"], "maxCursorSets": 3, "cursorSetMaxAge": 600}
    async with (
        start_publisher(layout_config(N, feed=cursorsets)) as service,
        aiohttp.ClientSession() as http,
    ):
        yield Client(service, http)


FIRST = {f"cursor{p}": "_first" for p in range(N)}


async def test_every_event_in_its_partition_in_order_with_checkpoints(client: Client) -> None:
    async with client.http.get(client.service.url + "/changefeeds") as response:
        assert (await response.json())["partitions"] == N, "what a client passes as n"
    ids = [f"vm-{i}" for i in range(40)]
    cursors = await client.publish(*ids)
    events, checkpoints = await client.read(**FIRST, pagesizehint=1000)
    assert sorted(e["data"]["cursor"] for e in events) == sorted(cursors)
    assert {e["partition"] for e in events} == set(range(N)), "40 ids spread over 4 partitions"
    for event in events:
        assert event["partition"] == partition_of(event["data"]["changedResourceId"], N)
        assert "headers" not in event, "no headers unless asked for"
    for p in range(N):
        mine = [e["data"]["cursor"] for e in events if e["partition"] == p]
        assert mine == sorted(mine), "a partition's events are in commit order"
    assert set(checkpoints) == set(range(N))

    # Passing the checkpoints back: nothing new, nothing repeated.
    again, later = await client.read(**{f"cursor{p}": c for p, c in checkpoints.items()})
    assert again == []
    assert all(later.get(p, checkpoints[p]) == checkpoints[p] for p in range(N))


async def test_checkpoints_resume_exactly_page_by_page(client: Client) -> None:
    """A client that persists every event before a checkpoint follows the feed exactly, while
    changes keep arriving between its requests."""
    committed = await client.publish(*(f"a-{i}" for i in range(25)))
    state = dict(FIRST)
    seen: list[str] = []
    for round in range(40):
        events, checkpoints = await client.read(**state, pagesizehint=7)
        assert len(events) <= 7
        seen += [e["data"]["cursor"] for e in events]
        state.update({f"cursor{p}": c for p, c in checkpoints.items()})
        if round == 2:
            committed += await client.publish(*(f"b-{i}" for i in range(20)))
        if not events and round > 3:
            break
    assert sorted(seen) == sorted(committed), "every item exactly once"


async def test_first_last_and_waiting(client: Client) -> None:
    old = await client.publish("before-1", "before-2")
    events, checkpoints = await client.read(**{f"cursor{p}": "_last" for p in range(N)})
    assert events == [] and set(checkpoints) == set(range(N)), "_last gives concrete cursors"

    waiting = asyncio.create_task(
        client.read(**{f"cursor{p}": c for p, c in checkpoints.items()}, wait=scaled(30))
    )
    await eventually(lambda: client.service.hub.waiters.waiting == 1, "the read waits on the hub")
    assert not waiting.done()
    new = await client.publish("after-1")
    events, _ = await asyncio.wait_for(waiting, scaled(10))
    assert [e["data"]["cursor"] for e in events] == new

    events, _ = await client.read(**FIRST)
    assert sorted(e["data"]["cursor"] for e in events) == old + new


async def test_a_subset_of_partitions(client: Client) -> None:
    await client.publish(*(f"s-{i}" for i in range(30)))
    events, checkpoints = await client.read(cursor2="_first", cursor3="_first")
    assert events and {e["partition"] for e in events} <= {2, 3}
    assert set(checkpoints) == {2, 3}


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ("ce_id,ce_type", {"ce_id", "ce_type"}),
        ("_all", {"ce_id", "ce_type", "ce_subject", "ce_time", "ce_source"}),
        ("ce_subject,nope", {"ce_subject"}),
    ],
)
async def test_headers(client: Client, headers: str, expected: set[str]) -> None:
    [cursor] = await client.publish("h-1")
    events, _ = await client.read(**FIRST, headers=headers)
    [event] = events
    assert set(event["headers"]) == expected
    values = {"ce_id": cursor, "ce_type": "vm", "ce_subject": "h-1",
              "ce_source": client.service.bucket.name}
    for name in expected & set(values):
        assert event["headers"][name] == values[name]
    if "ce_time" in expected:
        assert event["headers"]["ce_time"].endswith("Z")


async def test_cursorset_and_resume(client: Client) -> None:
    first = await client.publish(*(f"c-{i}" for i in range(10)))
    owner = {"cursorset": "forwarder", "consumer": "billing"}
    events, checkpoints = await client.read(**FIRST, **owner)
    assert sorted(e["data"]["cursor"] for e in events) == sorted(first)
    resume = {"resume": ",".join(map(str, range(N))), **owner}
    # The stored cursors are the last *input* ones: resuming repeats the same response.
    again, _ = await client.read(**resume)
    assert sorted(e["data"]["cursor"] for e in again) == sorted(first)

    # Acknowledge by passing the checkpoints with the cursorset; resuming then goes on from them.
    await client.read(**{f"cursor{p}": c for p, c in checkpoints.items()}, **owner, pagesizehint=0)
    more = await client.publish("c-late")
    events, _ = await client.read(**resume)
    assert [e["data"]["cursor"] for e in events] == more

    # Another consumer's cursorset of the same name is its own.
    status, message = await client.error({"n": N, "resume": "0", "cursorset": "forwarder",
                                          "consumer": "other"})
    assert status == 400 and "holds no cursor for partition(s) 0" in message


async def test_cursors_are_stored_only_for_configured_consumers(client: Client) -> None:
    """The reported attack: anyone rewriting a consumer's stored cursors, creating a key per
    request. Unknown consumers are refused (403) and write nothing."""
    redis = client.service.bucket.redis
    before = set(await redis.keys("*"))
    for i in range(20):
        status, message = await client.error(
            {"n": N, **FIRST, "cursorset": f"set{i}", "consumer": f"stranger{i}",
             "pagesizehint": 0, "store_cursor": 1}
        )
        assert status == 403 and "not one of feed.consumers" in message
    status, message = await client.error(
        {"n": N, "resume": "0", "cursorset": "main", "consumer": "stranger"}
    )
    assert status == 403 and "'stranger'" in message
    assert set(await redis.keys("*")) == before, "a refused request writes nothing"


async def test_cursor_sets_are_bounded_per_consumer_and_expire(client: Client) -> None:
    redis = client.service.bucket.redis
    tag = "{" + client.service.bucket.name + "}"
    for i in range(3):
        events, _ = await client.read(**FIRST, cursorset=f"set{i}", consumer="billing",
                                      pagesizehint=0)
        assert events == []
    status, message = await client.error(
        {"n": N, **FIRST, "cursorset": "set3", "consumer": "billing", "pagesizehint": 0}
    )
    assert status == 409 and "already has 3 cursor sets (feed.maxCursorSets)" in message
    # Storing again in an existing set is fine; another consumer has its own budget.
    await client.read(**FIRST, cursorset="set0", consumer="billing", pagesizehint=0)
    await client.read(**FIRST, cursorset="set3", consumer="other", pagesizehint=0)
    keys = sorted([k.decode() async for k in redis.scan_iter(match=tag + ":cursorset*")])
    assert len(keys) == 3 + 1 + 1 + 1, keys  # billing's 3 sets and index, other's set and index
    for key in keys:
        ttl = await redis.pttl(key)
        assert 0 < ttl <= 600_000, (key, ttl)

    # A set not stored for cursorSetMaxAge is gone, and frees its place.
    await redis.delete(tag + ":cursorset:billing:set1")  # what its expiry does
    await redis.zadd(tag + ":cursorsets:billing", {"set1": 0})  # last stored long ago
    await client.read(**FIRST, cursorset="set3", consumer="billing", pagesizehint=0)
    status, message = await client.error(
        {"n": N, "resume": "0", "cursorset": "set1", "consumer": "billing"}
    )
    assert status == 400 and "holds no cursor" in message


async def test_trimmed_cursor_is_gone(client: Client) -> None:
    await client.publish("t-1")
    _, checkpoints = await client.read(**FIRST)
    await client.publish(*(f"t-{i}" for i in range(2, 12)))
    await client.service.bucket.log.trim(None, max_items=2)
    status, message = await client.error(
        {"n": N, **{f"cursor{p}": c for p, c in checkpoints.items()}}
    )
    assert status == 410 and "older than the retained log" in message


async def test_an_epoch_that_changes_while_a_read_waits_is_gone(client: Client) -> None:
    """The cursors are resolved against the bucket's epoch, then the read waits; meanwhile Redis
    loses history and the bucket gets a new epoch (a rollback a publisher saw), and a commit
    wakes the read. What it reads is of the new history: it must not go out under the old
    epoch's cursors (the reader would take it for a continuation, and never learn of the loss);
    the feed answers 410, as for a cursor of another epoch."""
    old = await client.publish("e-1")
    _, checkpoints = await client.read(**{f"cursor{p}": "_last" for p in range(N)})
    params = {"n": N, **{f"cursor{p}": c for p, c in checkpoints.items()}, "wait": scaled(30)}
    waiting = asyncio.create_task(client.error(params))
    await eventually(lambda: client.service.hub.waiters.waiting == 1, "the read waits on the hub")
    assert await client.service.bucket.log.renew_epoch(Position.decode(old[0]).epoch)
    await client.publish("e-2")
    status, message = await asyncio.wait_for(waiting, scaled(10))
    assert status == 410 and "epoch changed" in message


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"n": 2, "cursor0": "_first"}, "n=2 but this feed has 4 partition(s)"),
        ({"cursor0": "_first"}, "n (the number of partitions"),
        ({"n": N}, "pass a cursorN"),
        ({"n": N, "cursor4": "_first"}, "cursor4: partition 4 is not below n=4"),
        ({"n": N, "cursor0": "bogus"}, "cursor0 must be _first, _last or a cursor"),
        ({"n": N, "cursor0": "_first", "pagesizehint": "-1"}, "pagesizehint"),
        ({"n": N, "cursor0": "_first", "wait": "later"}, "wait"),
        ({"n": N, "cursor0": "_first", "cursorset": "x"}, "need consumer="),
        ({"n": N, "resume": "0", "consumer": "c"}, "resume needs cursorset"),
        ({"n": N, "resume": "0", "cursor0": "_first", "cursorset": "x"}, "not both"),
        ({"n": N, "resume": "9", "cursorset": "x", "consumer": "c"}, "resume must list"),
        ({"n": N, "cursor0": "_first", "cursorset": "a b", "consumer": "c"}, "cursorset must be"),
        ({"n": N, "cursor0": "_first", "colour": "red"}, "parameter(s) 'colour' (known: consumer,"),
    ],
)
async def test_bad_requests_are_400(client: Client, params: dict[str, Any], message: str) -> None:
    status, text = await client.error(params)
    assert status == 400 and message in text
