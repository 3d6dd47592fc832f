"""The bare broadcast baseline: a `websockets` server that sends the same frames to the same
clients, with nothing of the change feed around it (no window, cursors, epochs or slow-consumer
handling). Run as a process of its own:

    python -m bench.broadcast --mode stream --redis unix:///tmp/r/redis.sock --loop uvloop
    python -m bench.broadcast --mode timer --rate 200 --origin 123456789
    python -m bench.broadcast --mode idle

It reads a listener's registration (docs/protocol.md v1), answers it, and indexes the socket by
the sub-resources it asked for. `stream` tails a Redis stream written by `ChangeBucket` (the
publisher's log) and sends each entry, encoded once as the publisher's item, to exactly the
sockets registered for its sub-resource, with `websockets.broadcast`. `timer` makes `--rate`
items a second itself, stamped with the time each is due (`bench.items.due_times`, as the driver
stamps a commit). `idle` sends nothing. `--loop` is the publisher's event loop (`bench.loops`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
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
            for _, entries in reply:
                for entry_id, fields in entries:
                    last = entry_id
                    entry = parse_entry(entry_id, fields)
                    subs = entry.sub_resources
                    targets = self.index[subs[0]] if len(subs) == 1 else set().union(
                        *(self.index[s] for s in subs)
                    )
                    broadcast(targets, entry.item(items.EPOCH).encode().decode())

    async def timer(self, rate: float, origin_ns: int) -> None:
        for due in items.due_times(time.monotonic_ns(), rate):
            # Behind schedule it still yields, so new connections are accepted meanwhile.
            await asyncio.sleep(max(0, due - time.monotonic_ns()) / 1e9)
            payload = items.item(items.stamp(due, origin_ns), time.time_ns() // 1_000_000)
            broadcast(self.everyone, payload.decode())


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
        elif args.mode == "timer":
            await broadcaster.timer(args.rate, args.origin)
        else:
            await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["stream", "timer", "idle"], default="idle")
    parser.add_argument("--redis", default="")
    parser.add_argument("--stream", default=BUCKET.log,
                        help="the log of a one-partition bucket (default: bucket `bench`'s)")
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--origin", type=int, default=0)
    parser.add_argument("--loop", choices=loops.LOOPS, default="asyncio")
    arguments = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        loops.run(main(arguments), arguments.loop)
