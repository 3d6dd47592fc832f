"""`PullConsumer(durable=...)` against real publishers on a real redis-server: instances sharing
work, an instance that dies without acking, nak and in_progress through the client, Redis down,
refusals, and the end-to-end accounting: every committed cursor is acknowledged exactly once by
some instance, or is in the dead-letter record."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from changefeed.durable import Outcome
from changefeed.errors import ChangefeedError, ConsumerRecreated, InvalidOption
from listener import Backoff, DurableConsumer, Msg, PullConsumer, PullFailed, PullRejected
from publisher.bucket import ChangeBucket
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.servers import RedisServer, eventually, scaled

FAST = Backoff(initial=0.02, maximum=0.2)
DURABLE = {"consumers": ["billing"], "maxDeadLetters": 100000, "maxAckPending": 10000}


@pytest.fixture
def durable_config(redis_server: RedisServer, make_config: Callable[..., Config]) -> Config:
    return make_config(redis_server.url, durable=DURABLE, bucket={
        "redisUrl": redis_server.url, "name": "test", "partitions": 2,
    })


@pytest.fixture
async def service(durable_config: Config, start_publisher: PublisherFactory
                  ) -> AsyncIterator[Service]:
    async with start_publisher(durable_config) as started:
        yield started


async def commit(bucket: ChangeBucket, prefix: str, count: int) -> list[str]:
    return [await bucket.commit("vm", f"{prefix}/{n:04}", ["nic"], {"n": n})
            for n in range(count)]


async def dead_cursors(consumer: DurableConsumer) -> dict[str, str]:
    """cursor -> reason of every record of the dead-letter record naming one cursor."""
    found: dict[str, str] = {}
    after = None
    while True:
        page = await consumer.dead_letters(after, limit=1000)
        for record in page["records"]:
            if "cursor" in record:
                found[record["cursor"]] = record["reason"]
            else:
                raise AssertionError(f"an unexpected gap: {record}")
        if not page["more"]:
            return found
        after = page["records"][-1]["id"]


def test_pull_consumer_with_durable_builds_its_sibling_the_durable_consumer() -> None:
    # The older spelling, kept working; a type checker knows only DurableConsumer(url, name).
    consumer: Any = PullConsumer("http://127.0.0.1:1", durable="billing",  # type: ignore[call-arg]
                                 ack_wait=5, resource="vm")
    assert type(consumer) is DurableConsumer and consumer.config == {
        "filter": {"resource": "vm"}, "start": "first", "ack_wait": 5}
    assert not isinstance(consumer, PullConsumer) and not isinstance(
        PullConsumer("http://127.0.0.1:1"), DurableConsumer)
    untyped: Any = PullConsumer
    for option, value in (("ack_wait", 5), ("start", "last"), ("create", False)):
        with pytest.raises(InvalidOption, match=option):
            untyped("http://127.0.0.1:1", **{option: value})
    with pytest.raises(InvalidOption, match="durable"):
        PullConsumer("http://127.0.0.1:1", durable="no spaces")  # type: ignore[call-arg]


async def test_msg_ack_nak_in_progress_and_term_say_whether_they_took_effect(
    service: Service
) -> None:
    committed = await commit(service.bucket, "m", 3)
    async with DurableConsumer(service.url, "billing", resource="vm", ack_wait=30,
                               backoff=FAST) as consumer:
        msgs = await consumer.fetch(10, expires=5)
        assert [m.cursor for m in msgs] == committed and msgs[0].deliveries == 1
        assert msgs[0].item.changed_resource_id == "m/0000"
        first = await msgs[0].ack()
        assert first.applied and first.outcome is Outcome.APPLIED
        assert (await msgs[0].ack()).outcome is Outcome.NOT_PENDING
        assert (await msgs[1].in_progress()).applied
        assert (await msgs[1].nak()).applied
        again = await consumer.next(expires=5)
        assert again is not None and again.cursor == committed[1] and again.deliveries == 2
        assert (await msgs[1].ack()).outcome is Outcome.REDELIVERED
        assert (await again.term()).applied
        results = await consumer.ack([msgs[2]])
        assert [r.applied for r in results] == [True]
        assert await dead_cursors(consumer) == {committed[1]: "terminated"}
        info = await consumer.info()
        assert info["pending"] == 0 and info["counts"]["acked"] == 2


async def test_a_second_instance_with_another_config_is_refused(service: Service) -> None:
    async with DurableConsumer(service.url, "billing", ack_wait=30) as first:
        await first.fetch(1, expires=0)
    async with DurableConsumer(service.url, "billing", ack_wait=10) as second:
        with pytest.raises(PullRejected) as refused:
            await second.fetch(1, expires=0)
    assert refused.value.status == 409 and refused.value.code == "ConsumerExists"
    assert "ack_wait is 30.0, not 10.0" in refused.value.message


async def test_an_instance_that_dies_without_acking_has_its_items_redelivered_to_another(
    service: Service
) -> None:
    committed = await commit(service.bucket, "d", 3)
    dying = DurableConsumer(service.url, "billing", ack_wait=0.5, backoff=FAST)
    taken = await dying.fetch(3, expires=5)
    assert [m.cursor for m in taken] == committed
    await dying.aclose()  # gone without a word
    async with DurableConsumer(service.url, "billing", ack_wait=0.5, backoff=FAST) as other:
        got = await other.fetch(10, expires=scaled(5))
        assert [m.cursor for m in got] == committed and {m.deliveries for m in got} == {2}
        stale = await other.ack([m.delivery for m in taken])  # the dead one's, too late
        assert {r.outcome for r in stale} == {Outcome.REDELIVERED}
        assert all(r.applied for r in await other.ack(got))


async def test_nak_with_delay_through_the_client(service: Service) -> None:
    [cursor] = await commit(service.bucket, "n", 1)
    async with DurableConsumer(service.url, "billing", backoff=FAST) as consumer:
        msg = await consumer.next(expires=5)
        assert msg is not None
        loop = asyncio.get_running_loop()
        assert (await msg.nak(delay=0.4)).applied
        started = loop.time()
        again = await consumer.next(expires=scaled(5))
        assert again is not None and again.cursor == cursor and again.deliveries == 2
        assert loop.time() - started >= 0.35


async def test_two_instances_share_the_work_and_each_item_is_acked_once(
    service: Service
) -> None:
    acked: Counter[str] = Counter()
    handled: dict[str, list[str]] = {"a": [], "b": []}
    total = 120

    async def instance(name: str) -> None:
        async with DurableConsumer(service.url, "billing", ack_wait=30,
                                   backoff=FAST) as consumer:
            while sum(acked.values()) < total:
                for msg in await consumer.fetch(5, expires=1):
                    handled[name].append(msg.cursor)
                    await asyncio.sleep(0)  # the other instance's turn
                    if (await msg.ack()).applied:
                        acked[msg.cursor] += 1

    workers = [asyncio.create_task(instance(name)) for name in handled]
    committed = await commit(service.bucket, "s", total)
    await asyncio.wait_for(asyncio.gather(*workers), scaled(30))
    assert set(acked) == set(committed) and set(acked.values()) == {1}
    assert handled["a"] and handled["b"]
    assert not set(handled["a"]) & set(handled["b"])  # no redelivery: each handed to one


async def test_redis_down_is_retried_by_the_client_and_reported(
    tcp_redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(tcp_redis_server.url, durable=DURABLE)
    errors: list[ChangefeedError] = []
    async with start_publisher(config) as service, DurableConsumer(
        service.url, "billing", backoff=FAST, on_error=errors.append
    ) as consumer:
        [cursor] = await commit(service.bucket, "r", 1)
        msg = await consumer.next(expires=5)
        assert msg is not None and msg.cursor == cursor
        tcp_redis_server.stop()
        with pytest.raises(PullFailed) as failed:
            await consumer.fetch(1, expires=0.3)
        assert failed.value.status == 503
        errors.clear()
        acking = asyncio.create_task(msg.ack())
        await eventually(lambda: bool(errors), "the ack failed once")
        tcp_redis_server.start()
        result = await asyncio.wait_for(acking, scaled(10))
        assert result.outcome in (Outcome.APPLIED, Outcome.NOT_PENDING)
        assert all(isinstance(e, PullFailed) for e in errors)
        assert (await consumer.info())["pending"] == 0


# --- the end-to-end accounting --------------------------------------------------------------------


async def test_every_committed_cursor_is_acked_exactly_once_or_dead_lettered(
    durable_config: Config, start_publisher: PublisherFactory,
) -> None:
    """Three instances on two publishers, partitions 2, a writer committing meanwhile, and
    instances that ack, nak (with delays), stall with in_progress, terminate, or drop items as
    if they died. Accounting at the end: every committed cursor acked (applied) exactly once,
    or in the dead-letter record, never both."""
    rng = random.Random(17)
    acked: Counter[str] = Counter()
    committed: list[str] = []
    writing = asyncio.Event()

    async def behave(msg: Msg) -> None:
        poison = msg.item.changed_resource_id.startswith("poison/")
        roll = rng.random()
        if poison:
            await msg.nak()
        elif roll < 0.08:
            return  # dropped, as if the instance died holding it
        elif roll < 0.16:
            await msg.nak(delay=rng.choice([0.0, 0.05, 0.2]))
        elif roll < 0.2:
            await msg.term()
        else:
            if roll < 0.3:
                await msg.in_progress()
            result = await msg.ack()
            if result.applied:
                acked[msg.cursor] += 1

    dead: dict[str, str] = {}

    def settled() -> bool:
        return all(c in acked or c in dead for c in committed)

    async def instance(url: str) -> None:
        async with DurableConsumer(url, "billing", ack_wait=0.3, max_deliver=3,
                                   backoff=FAST) as consumer:
            while True:
                msgs = await consumer.fetch(rng.randint(1, 8), expires=0.5)
                for msg in msgs:
                    await behave(msg)
                if not msgs and not writing.is_set():
                    dead.update(await dead_cursors(consumer))
                    if settled():
                        return

    async with start_publisher(durable_config) as one, start_publisher(durable_config) as two:
        watcher = DurableConsumer(one.url, "billing", ack_wait=0.3, max_deliver=3)
        await watcher.ensure()
        writing.set()
        workers = [asyncio.create_task(instance(url)) for url in (one.url, two.url, one.url)]
        for round in range(10):
            committed += await commit(one.bucket, f"w{round}", 20)
            committed += await commit(two.bucket, "poison" if round % 5 == 0 else f"v{round}", 2)
            await asyncio.sleep(0)
        writing.clear()
        await asyncio.wait_for(asyncio.gather(*workers), scaled(60))
        dead_now = await dead_cursors(watcher)
        info = await watcher.info()
        await watcher.aclose()

    assert dead_now == dead
    assert len(set(committed)) == len(committed) == 220
    twice = [c for c, n in acked.items() if n > 1]
    assert twice == [], f"acknowledged more than once: {twice}"
    both = set(acked) & set(dead)
    assert not both, f"both acknowledged and dead-lettered: {both}"
    lost = [c for c in committed if c not in acked and c not in dead]
    assert lost == [], f"neither acknowledged nor dead-lettered: {lost}"
    assert set(acked) | set(dead) == set(committed)
    poison = [c for c, reason in dead.items() if reason == "max_deliveries"]
    assert len(poison) >= 4  # the poison items at least
    assert info["pending"] == 0 and info["counts"]["acked"] == len(acked)
    assert info["counts"]["dead_lettered"] == len(dead)


async def test_the_billing_example_of_the_docs_bills_each_change_once_on_two_workers(
    service: Service
) -> None:
    from tests.listener.app import doc_example

    module = doc_example("billing")
    committed = await commit(service.bucket, "vm", 30)
    broken = await service.bucket.commit("vm", "broken/1", ["nic"], {})
    stop = asyncio.Event()
    workers = [module.Billing(service.url) for _ in range(2)]
    running = asyncio.gather(*(worker.run(stop) for worker in workers))
    await eventually(
        lambda: len([i for w in workers for i in w.billed]) == 30
        and any(w.given_up for w in workers), "30 billed and 1 given up", 20,
    )
    stop.set()
    await asyncio.wait_for(running, scaled(10))
    async with DurableConsumer(service.url, "billing", resource="vm", ack_wait=30,
                               max_deliver=5) as watcher:
        dead = await dead_cursors(watcher)
        assert (await watcher.info())["pending"] == 0
    billed = [id for worker in workers for id in worker.billed]
    assert sorted(billed) == [f"vm/{n:04}" for n in range(30)]  # each once, over two workers
    assert dead == {broken: "terminated"} and len(committed) == 30
    assert [c for w in workers for c in w.given_up] == [broken]


async def test_consume_yields_messages_as_they_come(service: Service) -> None:
    committed = await commit(service.bucket, "c", 5)
    got: list[str] = []
    async with DurableConsumer(service.url, "billing", backoff=FAST) as consumer:
        async for msg in consumer.consume(2, expires=1):
            assert (await msg.ack()).applied
            got.append(msg.cursor)
            if len(got) == 3:
                more = await commit(service.bucket, "d", 2)  # arrives while consuming
            if len(got) == 7:
                break
        with pytest.raises(ValueError, match="expires"):
            await anext(consumer.consume(expires=0.5))
    assert got == committed + more


async def test_an_instance_that_meets_its_consumer_created_again_is_told_once(
    service: Service
) -> None:
    """The consumer an instance used is gone and a new one of its name exists (deleted here; a
    Redis restored from an older snapshot lost it the same way, and an instance's ensure made
    it again: the nemesis, seed 5203, whose durable consumer then lost a commit unannounced).
    The next fetch raises ConsumerRecreated, once; fetching goes on with the new consumer."""
    committed = await commit(service.bucket, "r", 2)
    async with DurableConsumer(service.url, "billing", backoff=FAST) as instance, \
            DurableConsumer(service.url, "billing", backoff=FAST) as other:
        got = await instance.fetch(10, expires=scaled(5))
        assert [m.cursor for m in got] == committed
        await other.delete()
        await other.ensure()  # a new consumer of the name, from the first item
        await instance.ensure()
        with pytest.raises(ConsumerRecreated) as told:
            await instance.fetch(10, expires=0)
        assert told.value.name == "billing" and told.value.before != told.value.now
        again = await instance.fetch(10, expires=scaled(5))
        assert [m.cursor for m in again] == committed
