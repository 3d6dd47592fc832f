"""P4: a listener bootstraps 100,000 objects (rows/s), against raw paging of the same Redis data
and an aiohttp route answering constant pages.

The objects are committed first (`commit_many`). The `listener.Listener` (pages of 1,000, the
publisher's maximum) runs in this process on the load cores, the publisher on the server core.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import orjson
import redis.asyncio as aioredis
import structlog

from bench.objects import object_id, state
from bench.scenario import Check, Context, Figure, Result
from bench.servers import baseline_loop, baseline_port, python_module
from bench.stack import Seed, ours
from listener import BootstrapDone, BootstrapRecords, Listener, ListenerConfig
from publisher.bucket import Change, ChangeBucket, Keys

PAGE = 1000

log = structlog.get_logger(__name__)


def _seed(count: int) -> Seed:
    async def seed(bucket: ChangeBucket) -> None:
        for start in range(0, count, 5000):
            await bucket.commit_many(
                Change.put("vm", object_id(n), ("state",), state(n))
                for n in range(start, min(count, start + 5000))
            )

    return seed


async def _listener(url: str, count: int) -> float:
    """Rows/s of a Listener walking the bootstrap route to its BootstrapDone."""
    rows = 0
    started = time.perf_counter()
    config = ListenerConfig(page_size=PAGE)
    async with Listener(url, instance="bench-bootstrap", service="bench",
                        resources={"vm": ["state"]}, config=config) as feed:
        async for event in feed:
            if isinstance(event, BootstrapRecords):
                rows += len(event.objects)
            elif isinstance(event, BootstrapDone):
                break
    seconds = time.perf_counter() - started
    if rows != count:
        raise RuntimeError(f"listener bootstrapped {rows} objects, expected {count}")
    return rows / seconds


async def _raw_paging(url: str, count: int) -> float:
    """Rows/s of keyset paging straight from Redis (ZRANGEBYLEX + HMGET), decoding each state."""
    client = aioredis.Redis.from_url(url)
    keys = Keys("bench")
    index, states = keys.index("vm"), keys.state("vm")
    rows = 0
    start: bytes = b"-"
    began = time.perf_counter()
    while True:
        ids: list[Any] = await client.zrangebylex(index, start, "+", start=0, num=PAGE)
        if not ids:
            break
        raws: list[Any] = await client.hmget(states, ids)
        objects = [orjson.loads(raw) for raw in raws]
        rows += len(objects)
        start = b"(" + ids[-1]
    seconds = time.perf_counter() - began
    await client.aclose()
    if rows != count:
        raise RuntimeError(f"raw paging read {rows} objects, expected {count}")
    return rows / seconds


async def _constant_pages(port: int, count: int) -> float:
    """Rows/s of fetching and decoding constant pages from a bare aiohttp route."""
    rows = 0
    url: str | None = f"http://127.0.0.1:{port}/c?page=0"
    began = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        while url is not None:
            async with session.get(url) as response:
                page = orjson.loads(await response.read())
            rows += len(page["items"])
            url = f"http://127.0.0.1:{port}{page['next']}" if page["next"] else None
    seconds = time.perf_counter() - began
    if rows != count:
        raise RuntimeError(f"constant pages gave {rows} objects, expected {count}")
    return rows / seconds


async def bootstrap_rate(ctx: Context) -> Result:
    count = ctx.size(100_000, 1_000)
    result = Result("P4", f"Listener bootstrap of {count:,} objects")
    async with ours(ctx, "p4-ours", seed=_seed(count)) as stack:
        cpu_before = stack.server.cpu_seconds()
        began = time.perf_counter()
        mine = await _listener(f"http://127.0.0.1:{stack.port}", count)
        server_share = (stack.server.cpu_seconds() - cpu_before) / (time.perf_counter() - began)
        raw = await _raw_paging(stack.redis_url, count)
        mine_loop = stack.loop
    pages = python_module(
        "pages", "bench.pages", ["--pages", str(count // PAGE), "--size", str(PAGE)],
        ctx.work / "p4-pages.log", ctx.cores.server, ctx.loop,
    )
    with pages:
        pages_loop = baseline_loop(pages)
        ctx.baseline_loops.add(pages_loop)
        constant = await _constant_pages(baseline_port(pages), count)
    slower = min(raw, constant)
    result.details = {"objects": count, "page": PAGE,
                      "rows_per_second": {"listener": round(mine), "raw redis paging": round(raw),
                                          "constant aiohttp pages": round(constant)},
                      "loops": {"publisher": mine_loop, "constant aiohttp pages": pages_loop}}
    result.cpu = {"listener": {"server": round(server_share, 3)}}
    result.checks.append(Check(
        "bootstrap rows/s",
        Figure(f"Listener, pages of {PAGE:,}", round(mine), "rows/s"),
        Figure("the slower of raw Redis paging "
               f"({round(raw):,}) and constant aiohttp pages ({round(constant):,})",
               round(slower), "rows/s"),
        ">= 0.6x", mine >= 0.6 * slower,
    ))
    return result
