"""Coalesced catch-up on a real publisher (issue 17, item 2): a listener registered with
`"coalesce": true` that stops reading is not closed when the window moves past it; it is sent
one item per id that changed, with the newest cursor, then it is live again. Beside it, a slow
listener without the flag is closed with 4008 exactly as before; past `limits.coalesceIds` ids
the coalescing one is closed with 4008 too; ill-typed flags are refused.

The slow listeners are raw sockets with tiny receive buffers that stop reading after their
registration reply (tests.publisher.delivery.test_hub.RawListener): nothing reads on their behalf.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest

from publisher.bucket import Change
from publisher.config.settings import Config
from publisher.delivery.hub import Subscriber
from publisher.delivery.hub_stats import coalescing
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.publisher.delivery.test_hub import LONG, RawListener
from tests.servers import RedisServer, scaled
from tests.wsclient import Feed, refused, register, v1

LIMITS = {"window": 200, "sendBuffer": 16384, "pingInterval": 60}
IDS = 40
"""Distinct ids the changes cycle over: far fewer than the items committed."""
BATCH = 100
MAX_ITEMS = 30_000


class Reader:
    """Reads a RawListener's socket frame by frame, on demand."""

    def __init__(self, raw: RawListener) -> None:
        self.raw = raw
        self.data = b""
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)

    async def frame(self, timeout: float = 10.0) -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        while True:
            frames = RawListener._frames(self.data, complete_only=True)
            if frames:
                opcode, payload = frames[0]
                header = 2 + (2 if len(payload) >= 126 else 0) + (6 if len(payload) >= 65536 else 0)
                self.data = self.data[header + len(payload):]
                return opcode, payload
            chunk = await asyncio.wait_for(loop.sock_recv(self.raw.sock, 1 << 20), scaled(timeout))
            assert chunk, "the publisher closed the connection"
            self.data += chunk

    async def item(self) -> dict[str, Any]:
        opcode, payload = await self.frame()
        assert opcode == 0x1, (opcode, payload[:100])
        item: dict[str, Any] = orjson.loads(payload)
        return item


def _conn(service: Service, instance: str) -> Subscriber | None:
    return next((c for c in service.hub.connections if c.registration.instance == instance), None)


def _subs(k: int) -> list[str]:
    """Sub-resources of the k-th change: nic and alias alternate by round; every seventh is
    `state` only, which the slow listeners did not register for."""
    if k % 7 == 3:
        return ["state"]
    return ["nic"] if (k // IDS) % 2 == 0 else ["alias"]


async def _commit(service: Service, start: int, count: int) -> list[tuple[str, list[str], str]]:
    changes = [(f"{LONG}-{k % IDS}", _subs(k), k) for k in range(start, start + count)]
    cursors = await service.bucket.commit_many(
        Change.put("vm", id_, subs, {"n": k}) for id_, subs, k in changes
    )
    return [(id_, subs, cursor) for (id_, subs, _), cursor in zip(changes, cursors, strict=True)]


async def test_a_coalescing_listener_is_not_closed_and_gets_each_id_once_then_live(
    redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url, limits={**LIMITS, "coalesceIds": 1000})
    async with start_publisher(config) as service:
        body = v1("vm", ["nic", "alias"], instance="coalescing", coalesce=True)
        slow = await RawListener.register(service.url, body)
        assert slow.reply["coalesce"] is True and slow.reply["resumed"] is False
        plain = await RawListener.register(
            service.url, v1("vm", ["nic", "alias"], instance="plain"))
        assert "coalesce" not in plain.reply
        healthy = await register(service.ws_url, v1("vm", ["*"], instance="healthy"))
        committed: list[tuple[str, list[str], str]] = []
        # Commit until the listener without the flag is closed and the coalescing one has
        # folded more than a window's worth of items.
        hub = service.hub
        while _conn(service, "plain") is not None or hub.counters.coalesced["started"] == 0 or (
            (conn := _conn(service, "coalescing")) is not None
            and conn.coalesced is not None and conn.coalesced.folded < 3 * LIMITS["window"]
        ):
            assert len(committed) < MAX_ITEMS, "the slow listeners never fell behind"
            batch = await _commit(service, len(committed), BATCH)
            committed += batch
            assert [i["cursor"] for i in await healthy.take(BATCH)] == [c for *_, c in batch]
        conn = _conn(service, "coalescing")
        assert conn is not None and conn.coalesced is not None, "not closed: coalescing"
        assert len(conn.coalesced) <= IDS, "bounded by the ids, not the items"
        now = coalescing(service.hub)
        assert (now["listeners"], now["pending"]) == (1, len(conn.coalesced))
        assert len(hub.window) <= LIMITS["window"]
        folded = conn.coalesced.folded

        # The one without the flag: a gap-free prefix, then 4008 as before.
        *texts, close = await plain.read_to_end()
        assert close[0] == 0x8 and struct.unpack("!H", close[1][:2])[0] == 4008
        assert close[1][2:].decode() == "slow consumer: fell behind the window"
        assert all(b'"coalesced"' not in payload for _, payload in texts)

        # The coalescing one reads again: exact items, then one coalesced item per id.
        reader = Reader(slow)
        wanted = [(i, s, c) for i, s, c in committed if "state" not in s]
        exact: list[dict[str, Any]] = []
        coalesced: list[dict[str, Any]] = []
        while not (coalesced and coalesced[-1].get("caughtUp")):
            item = await reader.item()
            (coalesced if item.get("coalesced") else exact).append(item)
            assert not (coalesced and not item.get("coalesced")), "exact items come first"
        assert [i["cursor"] for i in exact] == [c for *_, c in wanted[: len(exact)]]
        rest = wanted[len(exact):]
        assert len(rest) >= folded, "folded: items of the catch-up; the rest came meanwhile"
        newest: dict[str, tuple[str, list[str]]] = {}
        for id_, subs, cursor in rest:
            merged = newest.get(id_, ("", []))[1]
            newest[id_] = (cursor, merged + [s for s in subs if s not in merged])
        assert {i["changedResourceId"] for i in coalesced} == set(newest), "every id, once"
        assert len(coalesced) == len(newest) <= IDS
        for item in coalesced:
            cursor, subs = newest[item["changedResourceId"]]
            assert item["cursor"] == cursor, "the newest cursor of its id"
            assert item["changeKind"] == {"resource": "vm", "subResources": subs}
        order = {cursor: n for n, (*_, cursor) in enumerate(wanted)}
        cursors = [order[i["cursor"]] for i in coalesced]
        assert cursors == sorted(cursors), "cursors only grow"
        last = [bool(i.get("caughtUp")) for i in coalesced]
        assert last == [False] * (len(coalesced) - 1) + [True]
        # Accounting: every committed item it wanted was sent exactly or folded in, once.
        assert len(exact) + hub.counters.coalesced["items"] == len(wanted)
        counted = hub.counters.coalesced
        assert counted["finished"] == 1 and counted["sent"] == len(coalesced)

        # Live again: the next change arrives as a plain item, with nothing in between.
        assert conn.live and conn.coalesced is None
        after = await service.bucket.commit("vm", "after", ["nic"], {"n": "after"})
        item = await reader.item()
        assert item["cursor"] == after and "coalesced" not in item
        assert (await healthy.next())["cursor"] == after

        # The newest state of each id is what its bootstrap route serves.
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{service.url}/changefeeds/stats") as response:
                stats = await response.json()
            assert stats["coalesced"] == {"started": 1, "finished": 1, "sent": len(coalesced),
                                          "items": len(wanted) - len(exact), "listeners": 0,
                                          "pending": 0}
            assert stats["closed"] == {"slowConsumer": 1}, "only the one without the flag"
            for id_ in list(newest)[:5]:
                n = max(k for k in range(len(committed)) if committed[k][0] == id_)
                async with http.get(f"{service.url}/vms/{id_}") as response:
                    assert await response.json() == {"n": n}

        # The caughtUp cursor is a resume point: nothing after it is missing.
        back = await register(service.ws_url, v1("vm", ["nic", "alias"], instance="back",
                                                   since=coalesced[-1]["cursor"]))
        assert back.reply["resumed"] is True
        assert (await back.next())["cursor"] == after
        for feed in (healthy, back):
            await feed.close()
        slow.sock.close()


async def test_past_coalesce_ids_the_listener_is_closed_with_4008(
    redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url, limits={**LIMITS, "coalesceIds": 10})
    async with start_publisher(config) as service:
        body = v1("vm", ["nic", "alias"], instance="coalescing", coalesce=True)
        slow = await RawListener.register(service.url, body)
        healthy: Feed = await register(service.ws_url, v1("vm", ["*"], instance="healthy"))
        committed: list[tuple[str, list[str], str]] = []
        while _conn(service, "coalescing") is not None:
            assert len(committed) < MAX_ITEMS, "never closed"
            batch = await _commit(service, len(committed), BATCH)
            committed += batch
            await healthy.take(BATCH)
        counted = service.hub.counters.coalesced
        assert counted["started"] == 1 and counted["finished"] == 0
        assert service.hub.counters.closed == {"slowConsumer": 1}, "closed once, counted once"
        *texts, close = await slow.read_to_end()
        assert close[0] == 0x8, close
        code, reason = struct.unpack("!H", close[1][:2])[0], close[1][2:].decode()
        assert code == 4008
        assert reason == "slow consumer: more than 10 ids changed while it was behind"
        wanted = [c for _, s, c in committed if "state" not in s]
        got = [orjson.loads(p)["cursor"] for _, p in texts]
        assert got == wanted[: len(got)], "a gap-free prefix, never a coalesced item"
        # It resumes from the last item it got, exactly as a listener closed with 4008 today.
        back = await register(service.ws_url, v1("vm", ["nic", "alias"], instance="coalescing",
                                                   since=got[-1], coalesce=True))
        assert back.reply["resumed"] is True
        assert [i["cursor"] for i in await back.take(len(wanted) - len(got), timeout=15)] == (
            wanted[len(got):])
        await back.close()
        await healthy.close()


@pytest.mark.parametrize(
    ("value", "shown"), [("yes", "'yes'"), (1, "1"), (None, "None"), ({"on": True}, "{'on': True}")]
)
async def test_an_ill_typed_coalesce_flag_is_refused_with_1008(
    publisher: Service, value: Any, shown: str
) -> None:
    code, reason = await refused(publisher.ws_url, orjson.dumps(v1(coalesce=value)).decode())
    assert code == 1008
    assert reason == f"registration coalesce must be true or false, not {shown}"
