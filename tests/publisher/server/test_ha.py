"""High availability (issue 2, §7): several publishers on one bucket, listeners on each.

Every publisher tails the bucket on its own, so a change committed through any of them reaches
every matching listener of every publisher, once per connection, in cursor order.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

from websockets.exceptions import ConnectionClosed

from changefeed.cursor import Position
from publisher.bucket import Change
from publisher.config.settings import Config
from publisher.delivery.hub_stats import registrations
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.servers import RedisServer
from tests.wsclient import Feed, register, v1, v2

SUBS = {"vm": ("nic", "alias", "state"), "network": ("ips", "name")}


@dataclass
class Listener:
    name: str
    kinds: dict[str, list[str]]
    feed: Feed

    def wants(self, resource: str, subs: tuple[str, ...]) -> bool:
        """The matching rule of RFD 5 (plus '*'), written independently of the publisher's."""
        wanted = self.kinds.get(resource)
        return wanted is not None and ("*" in wanted or bool(set(wanted) & set(subs)))


def _instance(name: str) -> str:
    return f"{name}-0000-4000-8000-000000000000"


async def _listen(service: Service, name: str, kinds: dict[str, list[str]]) -> Listener:
    instance = _instance(name)
    if len(kinds) == 1 and name.endswith("v1"):
        ((resource, subs),) = kinds.items()
        feed = await register(service.ws_url, v1(resource, subs, instance=instance))
        assert feed.reply["resource"] == resource
    else:
        feed = await register(service.ws_url, v2(kinds, instance=instance), "~2")
        assert [r["resource"] for r in feed.reply["bootstrapRoutes"]] == list(kinds)
    return Listener(name, kinds, feed)


async def test_two_publishers_every_listener_gets_every_matching_change_once_in_order(
    redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url)
    async with start_publisher(config) as a, start_publisher(config) as b:
        assert a.id != b.id and a.hub.epoch == b.hub.epoch
        listeners = [
            await _listen(a, "a-nic-v1", {"vm": ["nic"]}),
            await _listen(a, "a-all-v1", {"vm": ["*"]}),
            await _listen(a, "a-mix-v2", {"vm": ["alias"], "network": ["ips"]}),
            await _listen(b, "b-state-v1", {"vm": ["state"]}),
            await _listen(b, "b-net-v2", {"network": ["*"]}),
            await _listen(b, "b-name-v1", {"network": ["name"]}),
            await _listen(b, "b-mix-v2", {"vm": ["nic", "state"], "network": ["name"]}),
        ]
        on_a = {lst.feed.reply["cursor"] for lst in listeners[:3]}
        assert len(on_a) == 1, "no commit yet: one head"

        # Random (seeded) changes, committed concurrently through both publishers, one at a
        # time and in batches. Each writer keeps its own order; the log interleaves them.
        rng = random.Random(2)

        def change(i: int) -> Change:
            resource = rng.choice(list(SUBS))
            subs = rng.sample(SUBS[resource], rng.randint(1, len(SUBS[resource])))
            return Change.put(resource, f"{resource}-{i}", subs, {"i": i})

        async def writer(service: Service, first: int, count: int) -> list[tuple[str, Change]]:
            done: list[tuple[str, Change]] = []
            i = first
            while i < first + count:
                if rng.random() < 0.3:
                    batch = [change(j) for j in range(i, i + 7)]
                    cursors = await service.bucket.commit_many(batch)
                    done += zip(cursors, batch, strict=True)
                    i += len(batch)
                else:
                    one = change(i)
                    cursor = await service.bucket.commit(
                        one.resource, one.changed_resource_id, one.sub_resources, one.state
                    )
                    done.append((cursor, one))
                    i += 1
            return done

        via_a, via_b = await asyncio.gather(writer(a, 0, 150), writer(b, 1000, 150))
        # A last change of each resource that every listener matches: nothing unexpected can
        # hide after it, so no quiet period is needed to prove that nothing else arrives.
        last = [Change.put("vm", "vm-last", SUBS["vm"], {}),
                Change.put("network", "net-last", SUBS["network"], {})]
        tail = list(zip(await a.bucket.commit_many(last), last, strict=True))

        committed = sorted(via_a + via_b, key=lambda pair: Position.decode(pair[0]).position)
        committed += tail
        positions = [Position.decode(c).position for c, _ in committed]
        assert positions == sorted(set(positions)), "cursors are unique and ordered"
        # Cursor strings of one epoch sort like their positions.
        assert [c for c, _ in committed] == sorted(c for c, _ in committed)
        by_resource = {r: sum(1 for _, ch in committed if ch.resource == r) for r in SUBS}
        assert all(n > 20 for n in by_resource.values()), by_resource

        async def check(listener: Listener) -> int:
            expected = [
                (cursor, ch.resource, list(ch.sub_resources), ch.changed_resource_id)
                for cursor, ch in committed
                if listener.wants(ch.resource, ch.sub_resources)
            ]
            items = await listener.feed.take(len(expected), timeout=10)
            got = [
                (
                    i["cursor"],
                    i["changeKind"]["resource"],
                    i["changeKind"]["subResources"],
                    i["changedResourceId"],
                )
                for i in items
            ]
            assert got == expected, listener.name
            return len(expected)

        counts = await asyncio.gather(*(check(lst) for lst in listeners))
        # Every listener saw something and the filters really differ.
        assert min(counts) > 10 and len(set(counts)) > 3, counts
        # The listeners with '*' got everything of their resource.
        assert counts[1] == by_resource["vm"] and counts[4] == by_resource["network"]

        # Both publishers report their own listeners only, each fully caught up.
        for service, mine in ((a, listeners[:3]), (b, listeners[3:])):
            rows = registrations(service.hub, service.tail, service.id)
            assert {r["instance"] for r in rows} == {_instance(lst.name) for lst in mine}
            assert all(r["itemsBehindHead"] == 0 for r in rows)
        for lst in listeners:
            await lst.feed.close()


async def test_publisher_restart_does_not_disturb_the_other_publishers_listeners(
    redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    """One publisher stops; its listener goes with 1001; the other keeps streaming."""
    config = make_config(redis_server.url)
    async with start_publisher(config) as a:
        staying = await _listen(a, "stay-v1", {"vm": ["nic"]})
        async with start_publisher(config) as b:
            leaving = await _listen(b, "leave-v1", {"vm": ["nic"]})
            first = await b.bucket.commit("vm", "x", ["nic"], {})
            assert (await staying.feed.next())["cursor"] == first
            assert (await leaving.feed.next())["cursor"] == first
        closed = await _closed(leaving.feed)
        assert closed == 1001
        later = [await a.bucket.commit("vm", f"y{i}", ["nic"], {}) for i in range(5)]
        assert [i["cursor"] for i in await staying.feed.take(5)] == later
        await staying.feed.close()


async def _closed(feed: Feed) -> int:
    try:
        frame = await feed.next()
    except ConnectionClosed as exc:
        assert exc.rcvd is not None
        return exc.rcvd.code
    raise AssertionError(f"expected a close, got {frame!r}")
