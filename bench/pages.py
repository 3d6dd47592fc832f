"""P4's second baseline: an aiohttp route answering constant bootstrap pages, no Redis behind it.

    python -m bench.pages --pages 100 --size 1000 --loop uvloop

`GET /c?page=N` returns `{"items": [...], "next": "/c?page=N+1" | null, "cursor": ...}` with the
same objects P4 commits, built once at start-up: the cost of HTTP and JSON framing alone. `--loop`
is the publisher's event loop (`bench.loops`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

import orjson
from aiohttp import web

from bench import loops
from bench.objects import state


def build(pages: int, size: int) -> list[bytes]:
    bodies = []
    for page in range(pages):
        objects = [state(page * size + n) for n in range(size)]
        following = f"/c?page={page + 1}" if page + 1 < pages else None
        bodies.append(orjson.dumps({"items": objects, "next": following, "cursor": None}))
    return bodies


async def main(args: argparse.Namespace) -> None:
    bodies = build(args.pages, args.size)

    async def page(request: web.Request) -> web.Response:
        number = int(request.query.get("page", "0"))
        return web.Response(body=bodies[number], content_type="application/json")

    app = web.Application()
    app.router.add_get("/c", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    print(f"listening port={port} loop={loops.running()}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=100)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--loop", choices=loops.LOOPS, default="asyncio")
    arguments = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        loops.run(main(arguments), arguments.loop)
