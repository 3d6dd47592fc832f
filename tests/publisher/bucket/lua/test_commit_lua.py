"""commit.lua writes each run of puts (or deletes) to one resource with one HSET and one ZADD
(one HDEL and one ZREM): the store, the index and the log must end exactly as the changes
committed one by one leave them, whatever the mix of ops, ids and resources in a batch."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from changefeed.cursor import ZERO
from publisher.bucket import Change, ChangeBucket, Keys, connect
from publisher.bucket.values.changes import encode_change, pack_changes, unpack_bulk
from tests.servers import RedisServer

RESOURCES = ("vm", "network", "disk")


def put(resource: str, id: str, n: int) -> Change:
    return Change.put(resource, id, ["nic"], {"id": id, "n": n})


CASES = {
    "put, delete, put of one id": [put("vm", "a", 1), Change.delete("vm", "a", ["nic"]),
                                   put("vm", "a", 2)],
    "delete, put, delete of one id": [put("vm", "a", 0), Change.delete("vm", "a", ["nic"]),
                                      put("vm", "a", 1), Change.delete("vm", "a", ["nic"])],
    "one id put twice in a run": [put("vm", "a", 1), put("vm", "b", 1), put("vm", "a", 2)],
    "resources interleaved": [
        put("vm", "a", 1), put("network", "a", 1), put("vm", "b", 1),
        Change.delete("network", "a", ["nic"]), put("disk", "a", 1),
        Change.delete("vm", "a", ["nic"]), put("network", "a", 2), put("vm", "a", 3),
    ],
    "publishes inside runs": [
        put("vm", "a", 1), Change.publish("vm", "a", ["alias"]), put("vm", "b", 1),
        Change.publish("network", "z", ["nic"]), Change.delete("vm", "b", ["nic"]),
        Change.publish("vm", "b", ["nic", "alias"]), Change.delete("vm", "c", ["nic"]),
    ],
    "deletes of ids never stored": [Change.delete("disk", "x", ["nic"]),
                                    Change.delete("disk", "y", ["nic"]), put("disk", "x", 1)],
    "runs longer than the script's run bound": [
        *(put("vm", f"id-{i:04d}", i) for i in range(2500)), put("vm", "id-0999", -1),
        *(Change.delete("vm", f"id-{i:04d}", ["nic"]) for i in range(0, 2500, 2)),
        put("vm", "id-1000", -2),
    ],
}


@pytest.fixture
async def plain(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


async def _snapshot(
    client: aioredis.Redis, bucket: ChangeBucket
) -> tuple[dict[str, object], list[tuple[int, str, str, str]]]:
    """The store (fields in the hash's own order), the index and the log, without positions."""
    keys = Keys(bucket.name)
    store: dict[str, object] = {}
    for resource in RESOURCES:
        store[f"state:{resource}"] = list((await client.hgetall(keys.state(resource))).items())
        store[f"index:{resource}"] = await client.zrange(keys.index(resource), 0, -1,
                                                         withscores=True)
    log = []
    for partition, stream in enumerate(await bucket.log.streams()):
        rows: Any = await client.xrange(stream)
        log += [(partition, f[b"r"].decode(), f[b"s"].decode(), f[b"i"].decode()) for _, f in rows]
    return store, log


@pytest.mark.parametrize("partitions", [1, 3])
@pytest.mark.parametrize("case", list(CASES))
async def test_a_batch_leaves_what_its_changes_one_by_one_leave(
    redis_server: RedisServer, plain: aioredis.Redis, case: str, partitions: int
) -> None:
    changes = CASES[case]
    grouped = ChangeBucket(connect(redis_server.url), "grouped", None, partitions)
    single = ChangeBucket(connect(redis_server.url), "single", None, partitions)
    try:
        (committed,) = await grouped.log.commit_batches([(changes, None)])
        assert committed.count == len(changes)
        for change in changes:
            await single.commit_many([change])
        assert await _snapshot(plain, grouped) == await _snapshot(plain, single)
        entries = await grouped.log.read(ZERO, count=100_000)
        assert [str(e.position) for e in entries] == [
            f"{committed.ms}-{committed.first + n}" for n in range(len(changes))
        ], "one id per change, in order"
        assert [e.changed_resource_id for e in entries] == [
            c.changed_resource_id for c in changes
        ]
    finally:
        await grouped.aclose()
        await single.aclose()


def test_a_batch_is_packed_with_each_resource_once() -> None:
    changes = [put("vm", "a", 1), Change.delete("network", "b", ["ips"]),
               Change.publish("vm", "c", ["nic", "alias"])]
    packed = pack_changes([encode_change(c) for c in changes])
    assert packed.resources == ["vm", "network"]
    assert packed.arg_count == 2 + 4 * 3
    assert unpack_bulk(packed.args) == [
        b"vm", b"network",
        b"p1", b"a", b'["nic"]', b'{"id":"a","n":1}',
        b"d2", b"b", b'["ips"]', b"",
        b"u1", b"c", b'["nic","alias"]', b"",
    ]
    again = pack_changes([encode_change(c) for c in changes])
    assert again.digest() == packed.digest()
    assert pack_changes([encode_change(c) for c in changes[::-1]]).digest() != packed.digest()


@pytest.mark.parametrize("partitions", [1, 3])
@pytest.mark.parametrize("case", [c for c in CASES if len(CASES[c]) < 100])
async def test_a_call_of_several_transactions_leaves_what_they_one_by_one_leave(
    redis_server: RedisServer, plain: aioredis.Redis, case: str, partitions: int
) -> None:
    """Each transaction of a group numbers its own resources; the call maps them to its own."""
    changes = CASES[case]
    txns = [changes[at : at + 1 + at % 3] for at in range(0, len(changes), 1)][::2]
    grouped = ChangeBucket(connect(redis_server.url), "grouped", None, partitions)
    single = ChangeBucket(connect(redis_server.url), "single", None, partitions)
    try:
        done = await grouped.log.commit_batches([(txn, f"k{n}") for n, txn in enumerate(txns)])
        assert [c.count for c in done] == [len(txn) for txn in txns]
        assert len({(c.ms, c.first) for c in done}) == len(txns)
        for txn in txns:
            await single.commit_many(txn)
        assert await _snapshot(plain, grouped) == await _snapshot(plain, single)
    finally:
        await grouped.aclose()
        await single.aclose()
