"""The bare broadcast baseline: a `websockets` server that sends the same frames to the same
clients, with nothing of the change feed around it (no window, cursors, epochs or slow-consumer
handling). Run as a process of its own:

    python -m bench.broadcast --mode stream --redis unix:///tmp/r/redis.sock --loop uvloop
    python -m bench.broadcast --mode idle

It reads a listener's registration (docs/protocol.md v1), answers it, and indexes the socket by
the sub-resources it asked for. `stream` tails a Redis stream written by `ChangeBucket` (the
publisher's log) and sends each entry, encoded once as the publisher's item, to exactly the
sockets registered for its sub-resource, with `websockets.broadcast`: fed by the same driver as
the publisher, it pays the same Redis path. `idle` sends nothing. `--loop` is the publisher's
event loop (`bench.loops`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections import defaultdict
from typing import Any

import orjson
import redis.asyncio as aioredis
from websockets.asyncio.server import ServerConnection, broadcast, serve

from bench import items, loops
from changefeed.protocol import Resource
from publisher.bucket import Keys, parse_entry

REPLY = orjson.dumps(Resource("vm", ("nic",), "/vms").to_wire()).decode()
BUCKET = Keys("bench")


class Broadcaster:
    def __init__(self) -> None:
        self.index: dict[str, set[ServerConnection]] = defaultdict(set)
        self.everyone: set[ServerConnection] = set()

    async def handle(self, ws: ServerConnection) -> None:
        registration = orjson.loads(await ws.recv())
        subs = registration["changeKind"]["subResources"]
        await ws.send(REPLY)
        self.everyone.add(ws)
        for sub in subs:
            self.index[sub].add(ws)
        try:
            await ws.wait_closed()
        finally:
            self.everyone.discard(ws)
            for sub in subs:
                self.index[sub].discard(ws)

    async def tail(self, url: str, stream: str) -> None:
        client = aioredis.Redis.from_url(url)
        last: bytes = b"$"
        while True:
            reply: Any = await client.xread({stream: last}, count=1000, block=5000)
            for _, entries in reply or ():  # None when the wait timed out
                for entry_id, fields in entries:
                    last = entry_id
                    entry = parse_entry(entry_id, fields)
                    subs = entry.sub_resources
                    targets = self.index[subs[0]] if len(subs) == 1 else set().union(
                        *(self.index[s] for s in subs)
                    )
                    broadcast(targets, entry.item(items.EPOCH).encode().decode())


async def main(args: argparse.Namespace) -> None:
    broadcaster = Broadcaster()
    async with serve(
        broadcaster.handle, "127.0.0.1", 0, compression=None, max_size=65536,
        ping_interval=20, ping_timeout=10, backlog=1024,
    ) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        print(f"listening port={port} loop={loops.running()}", flush=True)
        if args.mode == "stream":
            await broadcaster.tail(args.redis, args.stream)
        else:
            await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["stream", "idle"], default="idle")
    parser.add_argument("--redis", default="")
    parser.add_argument("--stream", default=BUCKET.log,
                        help="the log of a one-partition bucket (default: bucket `bench`'s)")
    parser.add_argument("--loop", choices=loops.LOOPS, default="asyncio")
    arguments = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        loops.run(main(arguments), arguments.loop)
