"""Bootstrap pages narrowed by a watch: the plan (pure), then the pages on a real publisher."""

from __future__ import annotations

import bisect
import random
from typing import Any

import aiohttp
import pytest

from changefeed.cursor import Position
from changefeed.watch import Watch
from publisher.bucket import Change
from publisher.server.service import Service
from publisher.web.watch_pages import Piece, page_watched, pieces

W = Watch.of


@pytest.mark.parametrize(
    ("watch", "after", "plan"),
    [
        (W(ids=["b", "a"]), None, [Piece("a"), Piece("b")]),
        (W(prefixes=["servers"]), None, [Piece("servers"), Piece("[servers/", "(servers0")]),
        # Ids and deeper prefixes under a prefix of the watch are its run's already.
        (
            W(ids=["servers/1", "serversX", "a"], prefixes=["servers", "servers/2"]),
            None,
            [Piece("a"), Piece("servers"), Piece("[servers/", "(servers0"), Piece("serversX")],
        ),
        # `servers-1` sorts between `servers` and its run: the pieces stay in id order.
        (
            W(ids=["servers-1"], prefixes=["servers"]),
            None,
            [Piece("servers"), Piece("servers-1"), Piece("[servers/", "(servers0")],
        ),
        # The keyset marker: pieces wholly before it go, a run it falls in starts after it.
        (W(prefixes=["servers"]), "servers", [Piece("[servers/", "(servers0")]),
        (W(prefixes=["servers"]), "servers/5", [Piece("(servers/5", "(servers0")]),
        (W(prefixes=["servers"]), "servers/", [Piece("(servers/", "(servers0")]),
        (W(prefixes=["servers"]), "servers0", []),
        (W(prefixes=["servers"]), "a", [Piece("servers"), Piece("[servers/", "(servers0")]),
        (W(ids=["a", "c"]), "b", [Piece("c")]),
        # No watch: the whole index.
        (W(), None, [Piece("-", "+")]),
        (W(), "b", [Piece("(b", "+")]),
    ],
)
def test_pieces_plan_the_index_walk(watch: Watch, after: str | None, plan: list[Piece]) -> None:
    assert pieces(watch, after) == plan


def _walk(index: list[str], plan: list[Piece], limit: int) -> list[str]:
    """What PAGE_LUA does with `plan` on the sorted set `index` (ZSCORE, ZRANGEBYLEX)."""
    out: list[str] = []
    for piece in plan:
        if len(out) >= limit:
            break
        if piece.end is None:
            out += [piece.start] if piece.start in index else []
            continue
        assert piece.start[0] in "([-" and piece.end[0] in "(+"
        low = piece.start[1:]
        lo = (bisect.bisect_right if piece.start[0] == "(" else bisect.bisect_left)(index, low)
        hi = len(index) if piece.end == "+" else bisect.bisect_left(index, piece.end[1:])
        out += index[lo:hi][: limit - len(out)]
    return out


def test_walking_the_plan_pages_through_exactly_the_ids_the_watch_sees() -> None:
    rng = random.Random(7)
    names = ["servers", "servers/1", "servers/1/nic", "servers/10", "servers/2", "servers-1",
             "serversX", "server", "s", "s/ü", "x", "x/y/z", "a/b", "a//b", "a/"]
    for _ in range(300):
        index = sorted(rng.sample(names, rng.randrange(len(names))))
        watch = W(rng.sample(names, rng.randrange(4)), rng.sample(names, rng.randrange(4)))
        expected = [id for id in index if watch.matches(id)]
        limit = rng.randrange(1, 5)
        seen: list[str] = []
        after = None
        while True:
            page = _walk(index, pieces(watch, after), limit)
            seen += page
            if len(page) < limit:
                break
            after = page[-1]
        assert seen == expected, (watch, index)


# --- on a real publisher -------------------------------------------------------------------

IDS = [
    "a", "b/c", "server", "servers", "servers-a", "serversX", "zed",
    *(f"servers/{n}" for n in range(12)), "servers/1/nic", "servers/1/nic/0",
]


async def _walk_route(http: aiohttp.ClientSession, url: str) -> tuple[list[str], list[Any]]:
    """Every object of the pages from `url` on, and each page's body."""
    seen: list[str] = []
    pages: list[Any] = []
    next_url: str | None = url
    while next_url is not None:
        async with http.get(next_url) as response:
            assert response.status == 200, await response.text()
            page = await response.json()
        pages.append(page)
        seen += [item["uuid"] for item in page["items"]]
        next_url = page["next"]
    return seen, pages


async def test_bootstrap_route_with_ids_and_prefixes_pages_in_id_order(
    publisher: Service,
) -> None:
    bucket = publisher.bucket
    await bucket.commit_many(Change.put("vm", id, ["nic"], {"uuid": id}) for id in IDS)
    await bucket.commit("vm", "servers/3", ["nic"], delete=True)
    await bucket.publish("vm", "servers/99", ["nic"])  # an item only: nothing stored
    last = await bucket.commit("network", "servers/5", ["ips"], {"uuid": "net"})
    watch = W(ids=["zed", "a", "servers/1", "nope"], prefixes=["servers"])
    expected = sorted(id for id in IDS if watch.matches(id) and id != "servers/3")

    async with aiohttp.ClientSession(publisher.url) as http:
        seen, pages = await _walk_route(
            http, "/vms?limit=4&prefix=servers&id=zed&id=a&id=servers/1&id=nope"
        )
        assert seen == expected and len(pages) == len(expected) // 4 + 1
        for page in pages[:-1]:
            assert page["next"].startswith(
                "/vms?limit=4&id=a&id=nope&id=servers/1&id=zed&prefix=servers&marker="
            )
        assert all(Position.decode(page["cursor"]).encode() == last for page in pages)

        # A prefix deeper than another adds nothing; a trailing slash is the same prefix.
        again, _ = await _walk_route(http, "/vms?limit=3&prefix=servers/&prefix=servers/1")
        assert again == sorted(id for id in expected if id.startswith("servers"))
        nic, _ = await _walk_route(http, "/vms?prefix=servers/1/nic")
        assert nic == ["servers/1/nic", "servers/1/nic/0"]
        # Without a watch: every object, as before.
        everything, _ = await _walk_route(http, "/vms?limit=5")
        assert everything == sorted(set(IDS) - {"servers/3"})
        nothing, pages = await _walk_route(http, "/networks?id=a&prefix=servers/5/x")
        assert nothing == [] and pages[0]["cursor"] == last


async def test_watched_pages_on_redis_agree_with_the_watch(publisher: Service) -> None:
    rng = random.Random(11)
    segments = ["a", "b", "ab", "a-b", "ü", "0"]
    ids = sorted({"/".join(rng.choices(segments, k=rng.randrange(1, 4))) for _ in range(300)})
    await publisher.bucket.commit_many(Change.put("vm", id, ["nic"], {"uuid": id}) for id in ids)
    for _ in range(40):
        watch = W(rng.sample(ids, 3), rng.sample(ids, rng.randrange(1, 4)))
        seen: list[str] = []
        after = None
        while True:
            page = await page_watched(publisher.bucket, "vm", watch, after, 7)
            seen += page.ids
            assert len(page.states) == len(page.ids) and page.cursor is not None
            if len(page.ids) < 7:
                break
            after = page.ids[-1]
        assert seen == [id for id in ids if watch.matches(id)], watch


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("id=", "id must hold non-empty strings, not ''"),
        ("prefix=/", "prefix must not hold an empty prefix ('/')"),
        ("id=a&prefix=", "prefix must hold non-empty strings, not ''"),
        ("id=" + "x" * 513, "id holds an id longer than 512 bytes"),
    ],
)
async def test_bad_watch_parameters_are_400(publisher: Service, query: str, message: str) -> None:
    async with (
        aiohttp.ClientSession(publisher.url) as http,
        http.get(f"/vms?{query}") as response,
    ):
        assert response.status == 400
        body = await response.json()
    assert body == {"code": "InvalidWatch", "message": message}
