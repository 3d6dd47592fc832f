"""Idempotency keys in a real Redis: a commit retried with its key is written once and answered
with its first cursors; keys are forgotten after maxAge and beyond the bound."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import redis.asyncio as aioredis

from changefeed.cursor import ZERO
from changefeed.errors import ChangeError, ChangefeedError
from publisher.bucket import BATCH, Change, ChangeBucket, connect
from publisher.config.settings import Config


async def ids_in_log(bucket: ChangeBucket) -> list[str]:
    return [entry.changed_resource_id for entry in await bucket.log.read(ZERO, count=10_000)]


async def test_the_same_key_twice_writes_once_and_returns_the_first_cursor(
    bucket: ChangeBucket,
) -> None:
    first = await bucket.commit("vm", "a", ["nic"], {"n": 1}, key="req-1")
    again = await bucket.commit("vm", "a", ["nic"], {"n": 1}, key="req-1")
    assert again == first
    assert await ids_in_log(bucket) == ["a"]
    published = await bucket.publish("vm", "b", ["alias"], key="req-2")
    assert await bucket.publish("vm", "b", ["alias"], key="req-2") == published
    assert await bucket.commit("vm", "a", ["nic"], {"n": 1}) != first, "no key: a new commit"
    assert await ids_in_log(bucket) == ["a", "b", "a"]


async def test_a_key_used_again_for_other_changes_is_refused(bucket: ChangeBucket) -> None:
    await bucket.commit("vm", "a", ["nic"], {"n": 1}, key="req-1")
    with pytest.raises(ChangeError, match="idempotency key 'req-1' was first used for other"):
        await bucket.commit("vm", "a", ["nic"], {"n": 2}, key="req-1")
    assert await ids_in_log(bucket) == ["a"]
    assert await bucket.get("vm", "a") == b'{"n":1}'


async def test_a_multi_batch_call_retried_after_a_partial_application_writes_nothing_twice(
    bucket: ChangeBucket,
) -> None:
    changes = [Change.put("vm", f"vm-{i:04d}", ["state"], {"i": i}) for i in range(2 * BATCH + 7)]
    # The first call got its first two batches in, then failed (e.g. CommitOutcomeUnknown).
    applied = await bucket.commit_many(changes[:BATCH], key="import-7")
    (second,) = await bucket.log.commit_batches([(changes[BATCH : 2 * BATCH], "import-7#1")])
    applied += second.cursors

    retried = await bucket.commit_many(changes, key="import-7")
    assert retried[: 2 * BATCH] == applied, "the batches that got in keep their cursors"
    assert len(set(retried)) == len(changes)
    assert await ids_in_log(bucket) == [c.changed_resource_id for c in changes]
    assert await bucket.commit_many(changes, key="import-7") == retried


async def test_commit_batches_says_which_batches_were_written_now(bucket: ChangeBucket) -> None:
    a = [Change.publish("vm", "a", ["nic"])]
    b = [Change.publish("vm", "b", ["nic"]), Change.publish("vm", "c", ["nic"])]
    first = await bucket.log.commit_batches([(a, "ka"), (b, None)])
    again = await bucket.log.commit_batches([(a, "ka"), (b, "kb")])
    assert [c.fresh for c in first] == [True, True] and [c.fresh for c in again] == [False, True]
    assert again[0] == replace(first[0], fresh=False), "the first commit's positions"
    assert await ids_in_log(bucket) == ["a", "b", "c", "b", "c"]


async def test_keys_are_forgotten_after_max_age(
    bucket: ChangeBucket, plain: aioredis.Redis
) -> None:
    old = await bucket.publish("vm", "a", ["nic"], key="old")
    await asyncio.sleep(0.3)
    kept = await bucket.publish("vm", "b", ["nic"], key="kept")
    await bucket.log.trim(0.2)
    assert await plain.hkeys(bucket.keys.idempotency) == [b"kept"]
    assert await plain.zrange(bucket.keys.idempotency_times, 0, -1) == [b"kept"]
    assert await bucket.publish("vm", "b", ["nic"], key="kept") == kept
    assert await bucket.publish("vm", "a", ["nic"], key="old") != old, "forgotten: new commit"


async def test_at_most_the_bound_of_keys_is_remembered(
    config: Config, plain: aioredis.Redis
) -> None:
    assert config.bucket.redis_url
    bucket = ChangeBucket(
        connect(config.bucket.redis_url), "test", config.resources, idempotency_keys=3
    )
    try:
        cursors = [await bucket.publish("vm", f"v{i}", ["nic"], key=f"k{i}") for i in range(5)]
        assert sorted(await plain.hkeys(bucket.keys.idempotency)) == [b"k2", b"k3", b"k4"]
        assert await plain.zcard(bucket.keys.idempotency_times) == 3
        assert await bucket.publish("vm", "v4", ["nic"], key="k4") == cursors[4]
        assert await bucket.publish("vm", "v0", ["nic"], key="k0") != cursors[0]
    finally:
        await bucket.aclose()


def txn(n: int, *resources: str) -> list[Change]:
    subs = {"vm": ["nic"], "network": ["ips"]}
    return [Change.put(r, f"{r}-{n}", subs[r], {"n": n}) for r in resources or ("vm",)]


async def test_a_group_skips_its_transactions_applied_already_and_writes_the_others(
    bucket: ChangeBucket,
) -> None:
    """Small transactions go as one script call, each under its key: one applied before (alone,
    or in another group) is skipped, not refused, and keeps its first positions."""
    txns = [txn(n, "vm", "network") if n % 2 else txn(n) for n in range(6)]
    (alone,) = await bucket.log.commit_batches([(txns[1], "t1")])
    earlier = await bucket.log.commit_batches([(txns[3], "t3"), (txns[4], "t4")])
    done = await bucket.log.commit_batches([(t, f"t{n}") for n, t in enumerate(txns)])
    assert [c.fresh for c in done] == [True, False, True, False, False, True]
    assert done[1] == replace(alone, fresh=False)
    assert done[3:5] == [replace(c, fresh=False) for c in earlier]
    assert await ids_in_log(bucket) == [
        "vm-1", "network-1", "vm-3", "network-3", "vm-4",
        "vm-0", "vm-2", "vm-5", "network-5"]
    fresh = [c for c in done if c.fresh]
    assert [c.first for c in fresh] == [fresh[0].first, fresh[0].first + 1, fresh[0].first + 2]
    again = await bucket.log.commit_batches([(t, f"t{n}") for n, t in enumerate(txns)])
    assert [c.fresh for c in again] == [False] * 6
    assert len(await ids_in_log(bucket)) == 9


async def test_a_group_with_a_key_reused_for_other_changes_writes_nothing(
    bucket: ChangeBucket,
) -> None:
    await bucket.log.commit_batches([(txn(1), "t1")])
    with pytest.raises(ChangeError, match="idempotency key 't1' was first used for other"):
        await bucket.log.commit_batches([(txn(0), "t0"), (txn(2), "t1"), (txn(3), "t3")])
    assert await ids_in_log(bucket) == ["vm-1"]


async def test_a_group_that_fails_part_way_leaves_each_transaction_before_whole(
    bucket: ChangeBucket, plain: aioredis.Redis
) -> None:
    """The script fails in the group's third transaction (its resource's state key holds a
    string): the two before are in and remembered, the third left no log item; once the key is
    fixed, the same group sent again writes only what is missing."""
    txns = [txn(0), txn(1), txn(2, "network"), txn(3)]
    await plain.set(bucket.keys.state("network"), "not a hash")
    with pytest.raises(ChangefeedError, match="WRONGTYPE"):
        await bucket.log.commit_batches([(t, f"t{n}") for n, t in enumerate(txns)])
    assert await ids_in_log(bucket) == ["vm-0", "vm-1"]
    assert await bucket.get("vm", "vm-1") == b'{"n":1}'
    await plain.delete(bucket.keys.state("network"))
    done = await bucket.log.commit_batches([(t, f"t{n}") for n, t in enumerate(txns)])
    assert [c.fresh for c in done] == [False, False, True, True]
    assert await ids_in_log(bucket) == ["vm-0", "vm-1", "network-2", "vm-3"]
