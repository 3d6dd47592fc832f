"""What an SSE subscriber costs next to a websocket one (issue 17, item 3).

    python -m bench.studies.sse_vs_ws [--listeners 100] [--items 2000]

Two measurements, each websocket first, then SSE, in the same process:

1. `fanout`: the hub's fan-out alone (`Hub.publish`) to N subscribers of one kind whose
   transports only count bytes: CPU seconds per delivery, no sockets, no Redis.
2. `end-to-end`: a real publisher on a real redis-server, N subscribers on real sockets (raw
   readers that count bytes), `items` commits: deliveries per second from the first commit to
   the last byte at the last reader, and the process's CPU per delivery (publisher and readers:
   the readers cost the same for both kinds).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.transports import CountingTransport
from changefeed.cursor import ZERO, StreamId
from changefeed.protocol import ChangeKind, Registration
from changefeed_testing.servers import RedisServer, eventually, write_config
from publisher.bucket import Change, LogEntry
from publisher.config.settings import load_config
from publisher.delivery.hub import Hub, Subscriber
from publisher.delivery.window import Window
from publisher.server.service import Service


async def fanout(listeners: int, items: int, sse: bool) -> float:
    """CPU seconds per delivery of Hub.publish."""
    hub = Hub(Window(items + 1, ZERO), None, 1 << 30)  # type: ignore[arg-type]
    hub.epoch = "abcdefghij"
    registration = Registration("i", "s", (ChangeKind("vm", ("nic",)),), 2)
    for _ in range(listeners):
        hub.add(Subscriber(registration, CountingTransport(), None, "local", sse=sse))
    entries = [LogEntry(StreamId(1_700_000_000_000 + i, 0), "vm", ("nic",), f"vm-{i:06}")
               for i in range(1, items + 1)]
    start = time.process_time()
    for at in range(0, items, 10):  # as the tail brings them: a few at a time
        hub.fan_out(entries[at : at + 10])
    return (time.process_time() - start) / (listeners * items)


async def _reader(url: str, sse: bool) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, (host, int(port)))
    if sse:
        request = f"GET /changefeeds/sse?resource=vm&sub=nic HTTP/1.1\r\nHost: {host}\r\n\r\n"
        await loop.sock_sendall(sock, request.encode())
        return sock
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /changefeeds HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        "Accept-Version: ~1\r\n\r\n"
    )
    await loop.sock_sendall(sock, request.encode())
    payload = orjson.dumps({"instance": "i", "service": "bench",
                            "changeKind": {"resource": "vm", "subResources": ["nic"]}})
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    await loop.sock_sendall(sock, bytes([0x81, 0x80 | len(payload)]) + mask + masked)
    return sock


async def _count(sock: socket.socket, marker: bytes, items: int) -> None:
    """Read until `items` occurrences of `marker` (the cursor's epoch in each item) came."""
    loop = asyncio.get_running_loop()
    seen, tail = 0, b""
    while seen < items:
        data = tail + await loop.sock_recv(sock, 1 << 20)
        seen += data.count(marker) - tail.count(marker)
        tail = data[-32:]


async def end_to_end(service: Service, listeners: int, items: int, sse: bool) -> dict[str, Any]:
    socks = [await _reader(service.url, sse) for _ in range(listeners)]
    await eventually(lambda: len(service.hub.connections) >= listeners, "registrations", 30)
    marker = f'"cursor":"{service.hub.epoch}.'.encode()
    # + 1: the registration reply (the `registered` event) names the cursor too.
    readers = [asyncio.create_task(_count(s, marker, items + 1)) for s in socks]
    await asyncio.sleep(0.2)
    cpu, wall = time.process_time(), time.perf_counter()
    for at in range(0, items, 10):
        await service.bucket.commit_many(
            [Change.put("vm", f"vm-{at + i:06}", ["nic"], {"n": at + i}) for i in range(10)]
        )
    await asyncio.gather(*readers)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    for sock in socks:
        sock.close()
    await eventually(lambda: not service.hub.connections, "disconnections", 30)
    deliveries = listeners * items
    return {"deliveriesPerSecond": round(deliveries / wall),
            "cpuMicrosecondsPerDelivery": round(cpu / deliveries * 1e6, 2)}


async def main(listeners: int, items: int) -> None:
    results: dict[str, Any] = {"listeners": listeners, "items": items}
    for sse in (False, True):
        await fanout(listeners, items, sse)  # warm up
        cost = min([await fanout(listeners, items, sse) for _ in range(3)])
        results[f"fanout {'sse' if sse else 'websocket'} us/delivery"] = round(cost * 1e6, 3)
    with tempfile.TemporaryDirectory(prefix="cf-", dir="/tmp") as tmp:
        redis = RedisServer(Path(tmp)).start()
        try:
            config = load_config(write_config(Path(tmp) / "config.js", redis.url))
            service = Service(config)
            await service.start()
            try:
                for sse in (False, True):
                    results[f"end-to-end {'sse' if sse else 'websocket'}"] = await end_to_end(
                        service, listeners, items, sse
                    )
            finally:
                await service.stop()
        finally:
            redis.stop()
    ws_cost = results["fanout websocket us/delivery"]
    results["fanout ratio sse/websocket"] = round(results["fanout sse us/delivery"] / ws_cost, 2)
    ws, sse_run = results["end-to-end websocket"], results["end-to-end sse"]
    results["end-to-end ratio sse/websocket (cpu per delivery)"] = round(
        sse_run["cpuMicrosecondsPerDelivery"] / ws["cpuMicrosecondsPerDelivery"], 2
    )
    print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listeners", type=int, default=100)
    parser.add_argument("--items", type=int, default=2000)
    args = parser.parse_args()
    asyncio.run(main(args.listeners, args.items))
