"""P7's coalescing variant: slow listeners registered with `"coalesce": true`
(docs/protocol.md#coalesced-catch-up) against today's close (4008) and resume.

`Probe` is one paused listener in the driver's process: a raw websocket with a small receive
buffer, never read during the run. After it, `catch_up` reads it again and counts what it had to
receive to be up to date with the bucket's head: for a listener without the flag, what the
socket still held, its close frame, and the replay a registration with `since` (its last cursor)
sends; for a coalescing one, what the socket held up to its `caughtUp` item (it was never
closed). `transfer` runs that on a bounded set of hot ids, where coalescing pays.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tracemalloc
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from bench import wire
from bench.clients import HEADERS, PATH
from bench.scenario import Context, ScenarioError
from bench.stack import ours
from changefeed.cursor import Position, StreamId
from publisher.bucket import Change
from publisher.delivery.coalesce import Coalesced

RCVBUF = 4096
"""The probes' receive buffers, as P7's paused listeners'."""
READ_TIMEOUT = 10.0
HOT_IDS = 1000
HOT_CHANGES = 20_000
"""Changes committed after both probes fell out of the window."""
MAX_CHANGES = 500_000
TRANSFER_LIMITS = {"sendBuffer": 262144, "window": 1000, "pingInterval": 600}
"""P7's limits; pings far apart, as the probes do not answer them while paused (aiohttp would
drop them after a missed pong, which is not what is measured)."""


HOT_STREAM_IDS = 1000
HOT_STREAM_RATE = 2000.0
"""P7's second stream: `alias` changes to a hot set of ids, which only the paused listeners
(and, in the run without pauses, the same listeners reading) registered for. At 100 stamped
`nic` changes/s alone a paused listener never fills the kernel's socket buffers within the
run, so it never lags; with this stream it falls out of the window within seconds."""


def coalescing(registrations: list[bytes]) -> list[bytes]:
    """The same registrations, asking for a coalesced catch-up."""
    return [orjson.dumps({**orjson.loads(r), "coalesce": True}) for r in registrations]


def with_hot_stream(registrations: list[bytes]) -> list[bytes]:
    """The same registrations, for `alias` too: the hot stream's sub-resource."""
    out = []
    for raw in registrations:
        body = orjson.loads(raw)
        body["changeKind"]["subResources"] = ["nic", "alias"]
        out.append(orjson.dumps(body))
    return out


async def hot_stream(bucket: Any, stop: asyncio.Event, ids: int, rate: float) -> int:
    """Commit `rate` `alias` changes a second, in batches every 0.1 s, to `ids` hot ids until
    `stop` is set; returns how many were committed."""
    per_batch = max(1, round(rate / 10))
    committed = 0
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    try:
        while not stop.is_set():
            await bucket.commit_many(
                Change.put("vm", f"hot-{(committed + n) % ids:05d}", ["alias"],
                           {"n": committed + n})
                for n in range(per_batch)
            )
            committed += per_batch
            next_at += 0.1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, next_at - loop.time()))  # the pace
    finally:
        await bucket.aclose()
    return committed


@dataclass
class CatchUp:
    """What a probe received after it read again, until it was up to date."""

    coalesce: bool
    bytes: int = 0
    items: int = 0
    coalesced_items: int = 0
    closed: int | None = None
    """The close code it was sent (4008 without the flag), None if it was not closed."""
    resumed_bytes: int = 0
    resumed_items: int = 0
    last: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "last"}


class Reader:
    """Server frames from a raw socket, one at a time: (opcode, payload, bytes on the wire)."""

    def __init__(self, sock: socket.socket, data: bytes = b"") -> None:
        self.sock = sock
        self.data = data

    async def frame(self) -> tuple[int, bytes, int] | None:
        """The next frame, or None at the end of the stream."""
        loop = asyncio.get_running_loop()
        while True:
            frames, _ = wire.ws_frames(self.data)
            if frames:
                opcode, start, end = frames[0]
                payload, self.data = self.data[start:end], self.data[end:]
                return opcode, payload, end
            try:
                chunk = await asyncio.wait_for(loop.sock_recv(self.sock, 1 << 20), READ_TIMEOUT)
            except ConnectionResetError:
                return None  # aborted: a close frame not taken within the publisher's grace
            if not chunk:
                return None
            self.data += chunk


@dataclass
class Probe:
    port: int
    coalesce: bool
    reader: Reader | None = None
    start: str | None = None
    """The reply's cursor: where its stream began."""

    async def open(self, instance: str = "probe") -> None:
        """Register for vm/nic and read the reply; then read nothing until `catch_up`."""
        self.reader, self.start = await _register(
            self.port, instance, self.coalesce, None, RCVBUF)

    async def catch_up(self, head: str) -> CatchUp:
        """Read again until the probe has everything up to the cursor `head`."""
        assert self.reader is not None, "not open"
        result = CatchUp(self.coalesce)
        self.reader.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        while (frame := await self.reader.frame()) is not None:
            opcode, payload, size = frame
            result.bytes += size
            if opcode == wire.CLOSE:
                result.closed = int.from_bytes(payload[:2], "big")
                break
            if opcode != wire.TEXT:
                continue
            item = orjson.loads(payload)
            result.items += 1
            result.coalesced_items += bool(item.get("coalesced"))
            result.last = item["cursor"]
            if _reached(result.last, head):
                break
        else:
            result.closed = 1006  # aborted after its close frame's grace: no close frame read
        self.reader.sock.close()
        if result.closed is not None:
            # Today's way back: register with `since` and take the replay up to `head`.
            since = result.last or self.start
            reader, _ = await _register(self.port, "probe", False, since, None)
            while (frame := await reader.frame()) is not None:
                opcode, payload, size = frame
                result.resumed_bytes += size
                if opcode == wire.TEXT:
                    result.resumed_items += 1
                    if _reached(orjson.loads(payload)["cursor"], head):
                        break
            reader.sock.close()
        return result


def bytes_per_id(ids: int = 10_000) -> float:
    """What one pending id costs a coalescing listener's set, measured with tracemalloc on the
    publisher's own `Coalesced` for `ids` distinct 36-character ids (UUIDs, as Triton's), each
    changed twice (its two sub-resources merged)."""
    names = [f"{n:08x}-0000-4000-8000-{n:012x}" for n in range(ids)]  # allocated before
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        coalesced = Coalesced(ids)
        for round_, sub in enumerate(("nic", "alias")):
            for n, name in enumerate(names):
                coalesced.fold("vm", (sub,), name, StreamId(1 + round_, n))
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return round(used / ids, 1)


def _reached(cursor: str, head: str) -> bool:
    return Position.decode_single(cursor).position >= Position.decode_single(head).position


async def _register(
    port: int, instance: str, coalesce: bool, since: str | None, rcvbuf: int | None
) -> tuple[Reader, str]:
    """A registered raw websocket, its reply read: the reader of what follows, and the reply's
    cursor."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, wire.upgrade_request("127.0.0.1", port, PATH, HEADERS))
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, 4096), READ_TIMEOUT)
        if not chunk:
            raise RuntimeError("closed during the upgrade")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    if wire.upgrade_status(head) != 101:
        raise RuntimeError(f"upgrade refused: {head[:200]!r}")
    body: dict[str, Any] = {"instance": instance, "service": "bench",
                            "changeKind": {"resource": "vm", "subResources": ["nic"]}}
    if coalesce:
        body["coalesce"] = True
    if since is not None:
        body["since"] = since
    await loop.sock_sendall(sock, wire.client_frame(wire.TEXT, orjson.dumps(body)))
    reader = Reader(sock, rest)
    frame = await reader.frame()
    if frame is None or frame[0] != wire.TEXT:
        raise RuntimeError(f"registration refused: {frame!r:.200}")
    reply = orjson.loads(frame[1])
    if coalesce and reply.get("coalesce") is not True:
        raise RuntimeError("the publisher did not grant coalesce")
    if since is not None and reply.get("resumed") is not True:
        raise RuntimeError(f"could not resume from {since}")
    return reader, str(reply["cursor"])


async def transfer(ctx: Context) -> dict[str, Any]:
    """Two paused probes, one of each kind, while changes go to `HOT_IDS` ids (as fast as
    commit_many goes) until both fell out of the window, then `HOT_CHANGES` more; then what
    each had to receive to catch up."""
    more = ctx.size(HOT_CHANGES, 4000)
    hot = ctx.size(HOT_IDS, 200)
    async with ours(ctx, "p7-transfer", limits=TRANSFER_LIMITS) as stack:
        probes = [Probe(stack.port, False), Probe(stack.port, True)]
        for n, probe in enumerate(probes):
            await probe.open(f"probe-{n}")
        bucket = stack.bucket()
        url = f"http://127.0.0.1:{stack.port}/changefeeds/stats"
        head, committed, behind_at = "", 0, None
        async with aiohttp.ClientSession() as http:
            while behind_at is None or committed < behind_at + more:
                if committed >= MAX_CHANGES:
                    raise ScenarioError(f"the paused probes never fell behind ({committed:,})")
                cursors = await bucket.commit_many(
                    Change.put("vm", f"vm-{n % hot:05d}", ["nic"], {"n": n})
                    for n in range(committed, committed + 500)
                )
                head, committed = cursors[-1], committed + 500
                if behind_at is None:
                    async with http.get(url) as response:
                        stats = await response.json()
                    if stats["closed"].get("slowConsumer") and stats["coalesced"].get("started"):
                        behind_at = committed
        await bucket.aclose()
        results = [await probe.catch_up(head) for probe in probes]
    plain, merged = results
    return {"bytes_per_id": bytes_per_id(), "changes": committed,
            "changes_after_both_fell_behind": more, "ids": hot, "limits": TRANSFER_LIMITS,
            "close and resume": plain.to_json(), "coalesce": merged.to_json()}
