"""The bucket and the store in a real Redis: atomic commits, cursors, trimming, bootstrap pages."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any, cast

import aiohttp
import pytest
import redis.asyncio as aioredis

from changefeed.cursor import Position
from changefeed.errors import BucketUnavailable, ChangeError
from publisher.bucket import Change, ChangeBucket, connect
from publisher.bucket.redis import resp
from publisher.bucket.redis.channel import READ_SIZE
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.servers import RedisServer


async def test_concurrent_commits_leave_store_and_bucket_in_agreement(
    bucket: ChangeBucket, plain: aioredis.Redis
) -> None:
    rng = random.Random(7)
    ids = [f"vm-{i:03d}" for i in range(40)]

    async def writer(n: int) -> list[str]:
        cursors = []
        for _ in range(50):
            vm = rng.choice(ids)
            if rng.random() < 0.25:
                cursors.append(await bucket.commit("vm", vm, ["state"], delete=True))
            else:
                cursors.append(await bucket.commit("vm", vm, ["nic"], {"uuid": vm, "writer": n}))
        return cursors

    results = await asyncio.gather(*(writer(n) for n in range(8)))
    batch = await bucket.commit_many(
        [Change.put("vm", f"batch-{i}", ["alias"], {"uuid": f"batch-{i}"}) for i in range(1200)]
    )
    cursors = [c for result in results for c in result] + batch
    assert len(set(cursors)) == len(cursors) == 1600
    assert batch == sorted(batch), "a batch's cursors follow its order"

    log = await bucket.log.read(Position.decode(cursors[0]).position.__class__(0, 0), count=10_000)
    assert len(log) == 1600
    # Replay the log: the last change of each id decides whether it is stored.
    last: dict[str, str] = {}
    for entry in log:
        last[entry.changed_resource_id] = entry.sub_resources[0]
    stored = cast(dict[bytes, bytes], await plain.hgetall(bucket.keys.state("vm")))
    indexed = cast(list[bytes], await plain.zrange(bucket.keys.index("vm"), 0, -1))
    expected = {vm for vm, sub in last.items() if sub != "state"}
    assert {k.decode() for k in stored} == expected
    assert {k.decode() for k in indexed} == expected


async def test_unknown_resources_and_bad_ids_are_refused_before_writing(
    bucket: ChangeBucket, plain: aioredis.Redis
) -> None:
    for change, message in [
        (Change.put("disk", "d", ["nic"], {}), "unknown resource 'disk'"),
        (Change.put("vm", "v", ["cpu"], {}), "unknown sub-resource"),
        (Change.put("vm", "", ["nic"], {}), "non-empty string"),
        (Change.put("vm", "v", [], {}), "at least one sub-resource"),
    ]:
        with pytest.raises(ChangeError, match=message):
            await bucket.commit_many([Change.put("vm", "ok", ["nic"], {}), change])
    assert await plain.xlen(bucket.keys.log) == 0, "a refused batch writes nothing"


async def test_a_put_whose_state_is_not_an_object_is_refused_before_writing(
    bucket: ChangeBucket, plain: aioredis.Redis
) -> None:
    with pytest.raises(ChangeError, match=r"^vm 'x1': a put's state must be a JSON object, "
                                          r"got null \(a change without a state is a publish\)$"):
        await bucket.commit("vm", "x1", ["nic"])
    with pytest.raises(ChangeError, match=r"^vm 'x2': a put's state must be a JSON object, "
                                          r"got array$"):
        await bucket.commit("vm", "x2", ["nic"], ["nic"])
    with pytest.raises(ChangeError, match=r"got string$"):
        await bucket.commit_many([Change.publish("vm", "ok", ["nic"]),
                                  Change("vm", "x3", ("nic",), "put", "str")])
    assert await plain.xlen(bucket.keys.log) == 0, "a refused state writes nothing"
    await bucket.commit("vm", "x4", ["nic"], {"uuid": "x4"})
    await bucket.commit("vm", "x4", ["nic"], delete=True)  # a delete needs no state
    assert await plain.xlen(bucket.keys.log) == 2


async def test_trim_removes_old_items_and_records_the_horizon(bucket: ChangeBucket) -> None:
    # Ages far apart (1.5 s, and an age limit of 1 s), so a slow machine between the last
    # publish and the trims cannot make the new item old too (CI once trimmed 6).
    old = await bucket.publish_many([("vm", f"old-{i}", ["nic"]) for i in range(5)])
    await asyncio.sleep(1.5)
    new = await bucket.publish("vm", "new", ["nic"])
    assert await bucket.log.trim(1.0) == 5
    assert await bucket.log.trim(1.0) == 0, "trimming is idempotent"
    retention = await bucket.log.retention()
    assert retention.trimmed == Position.decode(old[-1]).position
    assert retention.oldest == retention.head == Position.decode(new).position
    await asyncio.sleep(1.5)
    assert await bucket.log.trim(1.0) == 1
    retention = await bucket.log.retention()
    assert retention.oldest is None
    assert retention.trimmed == retention.head == Position.decode(new).position


async def test_publisher_trims_by_max_age(
    redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: Callable[..., object],
) -> None:
    config = make_config(redis_server.url, maxAge=0.3, gcInterval=0.1)
    async with start_publisher(config) as service:  # type: ignore[attr-defined]
        await service.bucket.publish("vm", "a", ["nic"], key="k")
        for _ in range(100):
            if (await service.bucket.log.retention()).oldest is None:
                break
            await asyncio.sleep(0.05)
        retention = await service.bucket.log.retention()
        assert retention.oldest is None and retention.trimmed == retention.head
        again = await service.bucket.publish("vm", "a", ["nic"], key="k")
        assert Position.decode(again).position > retention.head, "the key went with its item"


async def test_bootstrap_pages_under_concurrent_writes(publisher: Service) -> None:
    bucket = publisher.bucket
    initial = [f"vm-{i:04d}" for i in range(0, 1000, 2)]
    await bucket.commit_many([Change.put("vm", i, ["state"], {"uuid": i}) for i in initial])
    deleted = set(initial[100:150])
    stop = asyncio.Event()

    async def churn() -> None:
        n = 1
        while not stop.is_set():
            await bucket.commit("vm", f"vm-{n:04d}", ["state"], {"uuid": f"vm-{n:04d}"})
            n += 2
        for vm in deleted:
            await bucket.commit("vm", vm, ["state"], delete=True)

    writer = asyncio.create_task(churn())
    seen: list[str] = []
    pages = 0
    url: str | None = "/vms?limit=37"
    async with aiohttp.ClientSession(publisher.url) as http:
        while url:
            async with http.get(url) as response:
                assert response.status == 200
                page = await response.json()
            seen += [item["uuid"] for item in page["items"]]
            assert Position.decode(page["cursor"])
            url = page["next"]
            pages += 1
            await asyncio.sleep(0)
    stop.set()
    await writer
    assert seen == sorted(seen) and len(seen) == len(set(seen)), "no item skipped or repeated"
    assert set(initial) - deleted <= set(seen), "every item present throughout is on some page"
    assert pages > 10


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/vms?limit=0", 400, "InvalidLimit"),
        ("/vms?limit=1001", 400, "InvalidLimit"),
        ("/vms?limit=abc", 400, "InvalidLimit"),
        ("/vms?marker=%%%", 400, "InvalidMarker"),
        ("/vms?marker=A", 400, "InvalidMarker"),
        ("/vms?colour=red", 400, "InvalidQuery"),
        ("/vms/absent", 404, "ResourceNotFound"),
        ("/nowhere", 404, "NotFound"),
    ],
)
async def test_bad_requests_get_json_4xx(
    publisher: Service, path: str, status: int, code: str
) -> None:
    async with aiohttp.ClientSession(publisher.url) as http, http.get(path) as response:
        assert response.status == status
        assert response.content_type == "application/json"
        body = await response.json()
    assert body["code"] == code and body["message"]


async def test_post_is_405_json(publisher: Service) -> None:
    async with aiohttp.ClientSession(publisher.url) as http, http.post("/vms") as response:
        assert response.status == 405
        assert (await response.json())["code"] == "MethodNotAllowed"


async def test_single_object_route(publisher: Service) -> None:
    await publisher.bucket.commit("vm", "a/b c", ["nic"], {"uuid": "a/b c", "n": 1})
    async with aiohttp.ClientSession(publisher.url) as http:
        async with http.get("/vms/a%2Fb%20c") as response:
            assert response.status == 200
            assert await response.json() == {"uuid": "a/b c", "n": 1}
        async with http.get("/vms?limit=1") as response:
            page = await response.json()
    assert page["items"] == [{"uuid": "a/b c", "n": 1}] and page["next"].startswith(
        "/vms?limit=1&marker="
    )


async def test_a_blocking_tail_read_survives_a_flushed_script_and_a_killed_connection(
    bucket: ChangeBucket, plain: aioredis.Redis
) -> None:
    """The tail's wait-and-read is sent as raw RESP on a pooled connection: when Redis forgot
    tail.lua (restarted, failed over, SCRIPT FLUSH) it loads it and reads; when the pooled
    connection was closed under it, it reads on a fresh one. Nothing is missed either way."""
    first = Position.decode(await bucket.commit("vm", "a", ["nic"], {"n": 1})).position
    read = await bucket.log.tail(first, 1000, 100)  # nothing after `first`: the wait times out
    assert read.entries == [] and read.head == first

    second = Position.decode(await bucket.commit("vm", "b", ["nic"], {"n": 2})).position
    await plain.script_flush()
    read = await bucket.log.tail(first, 1000, 100)
    assert [e.position for e in read.entries] == [second]

    third = Position.decode(await bucket.commit("vm", "c", ["nic"], {"n": 3})).position
    await plain.client_kill_filter(_type="normal", skipme=True)
    read = await bucket.log.tail(second, 1000, 100)
    assert [e.position for e in read.entries] == [third] and read.witnessed


async def test_a_blocked_tail_read_is_abandoned_at_once_and_later_ones_send_nothing(
    bucket: ChangeBucket,
) -> None:
    """The tail's stop() ends its blocked read by aborting the connection the read keeps: the
    read fails as BucketUnavailable now, not when its 5 s wait ends; a later blocking read fails
    at once too, and the bucket's other calls are not affected."""
    first = Position.decode(await bucket.commit("vm", "a", ["nic"], {"n": 1})).position
    blocked = asyncio.create_task(bucket.log.tail(first, 5000, 100))
    await asyncio.sleep(0.2)
    assert not blocked.done(), "the read waits for a change"
    started = asyncio.get_running_loop().time()
    bucket.log.abandon_reads()
    with pytest.raises(BucketUnavailable):
        await asyncio.wait_for(blocked, 2)
    assert asyncio.get_running_loop().time() - started < 1
    second = Position.decode(await bucket.commit("vm", "b", ["nic"], {"n": 2})).position
    with pytest.raises(BucketUnavailable, match="abandoned"):
        await asyncio.wait_for(bucket.log.tail(first, 5000, 100), 1)
    read = await bucket.log.tail(first, None, 100)
    assert [e.position for e in read.entries] == [second]


async def test_the_tail_reads_with_the_python_reply_reader_when_hiredis_is_missing(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without hiredis (a plain `pip install`), the tail's connection is read by `RespReader`:
    the wait-and-read gets the same entries, a batch larger than one socket read included."""
    monkeypatch.setattr(resp, "hiredis", None)
    assert config.bucket.redis_url
    bucket = ChangeBucket(connect(config.bucket.redis_url), "python-reader", config.resources)
    try:
        first = Position.decode(await bucket.commit("vm", "first", ["nic"], {"n": 0})).position
        waiting = asyncio.create_task(bucket.log.tail(first, 5000, 1000))
        await asyncio.sleep(0.1)
        ids = [f"{n:04d}-" + "x" * 80 for n in range(900)]
        assert sum(map(len, ids)) > READ_SIZE, "the reply takes more than one socket read"
        cursors = await bucket.commit_many(
            [Change.put("vm", i, ["nic"], {"n": 1}) for i in ids]
        )
        read = await waiting
        channel = (await bucket.log.shards())[0]._channel
        assert channel is not None
        assert isinstance(channel._parser, resp.RespReader)
        assert [e.position for e in read.entries] == [Position.decode(c).position for c in cursors]
        assert read.complete and read.witnessed
    finally:
        await bucket.aclose()


async def test_a_tail_read_that_redis_does_not_answer_times_out_and_the_next_one_reads(
    redis_server: RedisServer, config: Config
) -> None:
    """Redis paused (SIGSTOP) under a blocking read: the channel's watchdog aborts the read once
    the client's reply timeout has passed (BucketUnavailable, saying it timed out), and once
    Redis answers again the next read gets what was committed meanwhile."""
    assert config.bucket.redis_url
    bucket = ChangeBucket(connect(config.bucket.redis_url, blocking=True, timeout=1),
                          "paused", config.resources)
    try:
        first = Position.decode(await bucket.commit("vm", "a", ["nic"], {"n": 1})).position
        await bucket.log.tail(first, 100, 100)  # the channel's connection is taken
        redis_server.pause()
        try:
            started = asyncio.get_running_loop().time()
            with pytest.raises(BucketUnavailable, match=r"[Tt]imeout"):
                await asyncio.wait_for(bucket.log.tail(first, 500, 100), 5)
            assert asyncio.get_running_loop().time() - started < 3.5
        finally:
            redis_server.resume()
        second = Position.decode(await bucket.commit("vm", "b", ["nic"], {"n": 2})).position
        read = await bucket.log.tail(first, 1000, 100)
        assert [e.position for e in read.entries] == [second]
    finally:
        await bucket.aclose()


async def test_single_commits_keep_a_connection_and_survive_a_flush_a_kill_and_company(
    bucket: ChangeBucket, plain: aioredis.Redis
) -> None:
    """Single commits go on a connection they keep (`Channel`): a flushed script is loaded and
    the commit runs once; a kept connection Redis closed while idle is replaced before anything
    is sent (the commit is written, not 'outcome unknown'); commits made at once share it with
    the pool; every cursor is the one the log holds."""
    cursors = [await bucket.commit("vm", "a", ["nic"], {"n": 1})]
    await plain.script_flush()
    cursors.append(await bucket.commit("vm", "b", ["nic"], {"n": 2}))
    await plain.client_kill_filter(_type="normal", skipme=True)
    await asyncio.sleep(0.1)  # the loop sees the kept connection closed
    cursors.append(await bucket.commit("vm", "c", ["nic"], {"n": 3}))
    cursors += await asyncio.gather(
        *(bucket.commit("vm", f"many{n}", ["nic"], {"n": n}) for n in range(20))
    )
    kept = (await bucket.log.shards())[0].commits._commits
    assert kept is not None and kept._connection is not None
    log: list[tuple[bytes, Any]] = await plain.xrange("{test}:log")  # type: ignore[assignment]
    assert [entry_id.decode() for entry_id, _ in log] == [
        str(Position.decode(c).position) for c in sorted(cursors, key=_position_of)
    ]
    assert len(log) == 23, "each commit written once"


def _position_of(cursor: str) -> tuple[int, int]:
    position = Position.decode(cursor).position
    return position.ms, position.seq


async def test_a_single_commit_to_a_master_made_a_replica_is_not_written_and_the_next_reconnects(
    bucket: ChangeBucket, plain: aioredis.Redis, tcp_redis_server: RedisServer
) -> None:
    """A failover demotes the Redis a kept commit connection is on: the commit is answered
    READONLY, reported as BucketUnavailable (nothing written, not 'outcome unknown'), and the
    kept connection is dropped, so the next commit goes where the pool now connects."""
    await bucket.commit("vm", "a", ["nic"], {"n": 1})
    await plain.execute_command(  # type: ignore[no-untyped-call]
        "REPLICAOF", "127.0.0.1", str(tcp_redis_server.port)
    )
    try:
        with pytest.raises(BucketUnavailable, match="replica"):
            await bucket.commit("vm", "b", ["nic"], {"n": 2})
    finally:
        await plain.execute_command("REPLICAOF", "NO", "ONE")  # type: ignore[no-untyped-call]
    cursor = await bucket.commit("vm", "c", ["nic"], {"n": 3})
    assert await plain.xrange("{test}:log", str(Position.decode(cursor).position)) != []


async def test_a_tail_read_abandoned_while_its_connection_opens_sends_nothing(
    redis_server: RedisServer, config: Config
) -> None:
    """stop() during the connection's set-up (Redis slow to answer it): once the connection is
    up the read fails at once instead of starting a 5 s blocking wait."""
    assert config.bucket.redis_url
    bucket = ChangeBucket(connect(config.bucket.redis_url, blocking=True), "opening",
                          config.resources)
    try:
        first = Position.decode(await bucket.commit("vm", "a", ["nic"], {"n": 1})).position
        redis_server.pause()
        try:
            reading = asyncio.create_task(bucket.log.tail(first, 5000, 100))
            await asyncio.sleep(0.3)
            assert not reading.done()
            bucket.log.abandon_reads()
        finally:
            redis_server.resume()
        with pytest.raises(BucketUnavailable, match="abandoned"):
            await asyncio.wait_for(reading, 2)
    finally:
        await bucket.aclose()
