"""The bare broadcast baseline: a `websockets` server that sends the same frames to the same
clients, with nothing of the change feed around it (no window, cursors, epochs or slow-consumer
handling). Run as a process of its own:

    python -m bench.broadcast --mode stream --redis unix:///tmp/r/redis.sock --stream '{bench}:log'
    python -m bench.broadcast --mode timer --rate 200 --origin 123456789
    python -m bench.broadcast --mode idle

It reads a listener's registration (docs/protocol.md v1), answers it, and indexes the socket by
the sub-resources it asked for. `stream` tails a Redis stream written by `ChangeBucket` (the
publisher's log) and sends each entry, encoded once as the publisher's item, to exactly the
sockets registered for its sub-resource, with `websockets.broadcast`. `timer` makes `--rate`
items a second itself, stamped with the time each is due (`bench.items`). `idle` sends nothing.
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

from bench import items

REPLY = orjson.dumps({"resource": "vm", "subResources": ["nic"], "bootstrapRoute": "/vms"})


class Broadcaster:
    def __init__(self) -> None:
        self.index: dict[str, set[ServerConnection]] = defaultdict(set)
        self.everyone: set[ServerConnection] = set()

    async def handle(self, ws: ServerConnection) -> None:
        registration = orjson.loads(await ws.recv())
        subs = registration["changeKind"]["subResources"]
        await ws.send(REPLY.decode())
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
                    ms, seq = (int(part) for part in entry_id.split(b"-"))
                    subs = orjson.loads(fields[b"s"])
                    payload = items.item_json(
                        fields[b"r"].decode(), subs, fields[b"i"].decode(), ms,
                        items.fake_cursor(ms, seq),
                    )
                    targets = self.index[subs[0]] if len(subs) == 1 else set().union(
                        *(self.index[s] for s in subs)
                    )
                    broadcast(targets, payload.decode())

    async def timer(self, rate: float, origin_ns: int) -> None:
        started = time.monotonic_ns()
        number = 0
        while True:
            due = started + int(number * 1e9 / rate)
            now = time.monotonic_ns()
            # Behind schedule it still yields, so new connections are accepted meanwhile.
            await asyncio.sleep(max(0, due - now) / 1e9)
            # Stamped with the time it is due, as the driver stamps a commit: when the server
            # falls behind its schedule, the delay shows as latency, not as a lower rate.
            payload = items.item_json(
                "vm", ["nic"], items.stamp(due, origin_ns), time.time_ns() // 1_000_000,
                items.fake_cursor(time.time_ns() // 1_000_000, number % 4096),
            )
            broadcast(self.everyone, payload.decode())
            number += 1


async def main(args: argparse.Namespace) -> None:
    broadcaster = Broadcaster()
    async with serve(
        broadcaster.handle, "127.0.0.1", 0, compression=None, max_size=65536,
        ping_interval=20, ping_timeout=10, backlog=1024,
    ) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        print(f"listening port={port}", flush=True)
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
    parser.add_argument("--stream", default="{bench}:log")
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--origin", type=int, default=0)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(parser.parse_args()))
