"""Slow consumers (issue 2, §6): a listener that stops reading is closed with 4008 once the
publisher's shared window moves past it, while the others keep receiving everything, and the
publisher's memory stays bounded.

The slow listener is a raw TCP socket with a tiny receive buffer that simply stops reading after
its registration reply: nothing buffers on its behalf (a websockets client would keep reading
into its own queue). The kernel still absorbs a megabyte or two on loopback before the
publisher's own write buffer starts to fill, so the tests commit until the publisher drops it.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from changefeed.cursor import Position, StreamId
from publisher.bucket import Change
from publisher.config.settings import Config
from publisher.delivery.hub import CLOSE_GRACE
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.publisher.layouts import PARTITIONS, own, owns
from tests.servers import scaled
from tests.wsclient import Feed, register, v1, v2

LIMITS = {"window": 200, "sendBuffer": 16384, "pingInterval": 60}
BATCH = 50
MAX_ITEMS = 20_000
"""Give up (and fail) if the slow listener is still connected after this many items."""
LONG = "x" * 470
"""Ids are long so that items are sizable (~600 bytes on the wire)."""


class RawListener:
    """A websocket client on a bare non-blocking socket: reads only when told to."""

    def __init__(self, sock: socket.socket, reply: dict[str, Any]) -> None:
        self.sock = sock
        self.reply = reply

    @classmethod
    async def register(cls, url: str, body: dict[str, Any], rcvbuf: int = 1024) -> RawListener:
        host, port = url.removeprefix("http://").split(":")
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        # Before connect(), so the advertised window stays tiny.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await loop.sock_connect(sock, (host, int(port)))
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET /changefeeds HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            "Accept-Version: ~1\r\n\r\n"
        )
        await loop.sock_sendall(sock, request.encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 4096), scaled(5))
            assert chunk, "connection closed during the handshake"
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        payload = orjson.dumps(body)
        assert len(payload) < 126
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        await loop.sock_sendall(sock, bytes([0x81, 0x80 | len(payload)]) + mask + masked)
        # Read exactly the registration reply, a byte at a time, and nothing more.
        assert not rest, "nothing is sent before the registration"
        while not (frames := cls._frames(rest, complete_only=True)):
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 1), scaled(5))
            assert chunk, "closed before the registration reply"
            rest += chunk
        opcode, reply = frames[0]
        assert opcode == 0x1, (opcode, reply)
        return cls(sock, orjson.loads(reply))

    async def read_to_end(self) -> list[tuple[int, bytes]]:
        """Read everything the publisher sent, up to end of stream; return the frames."""
        # The advertised window was tiny: open it so that the backlog arrives quickly.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        loop = asyncio.get_running_loop()
        data = b""
        while True:
            try:
                chunk = await asyncio.wait_for(loop.sock_recv(self.sock, 1 << 20), scaled(5))
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
        self.sock.close()
        return self._frames(data, complete_only=False)

    @staticmethod
    def _frames(data: bytes, complete_only: bool) -> list[tuple[int, bytes]]:
        """Server frames (unmasked) in `data`: (opcode, payload). A cut-off last frame is
        dropped when `complete_only`, else reported with opcode -1."""
        frames = []
        pos = 0
        while pos + 2 <= len(data):
            first, length = data[pos], data[pos + 1] & 0x7F
            header = 2 + {126: 2, 127: 8}.get(length, 0)
            if pos + header > len(data):
                break
            if length == 126:
                (length,) = struct.unpack_from("!H", data, pos + 2)
            elif length == 127:
                (length,) = struct.unpack_from("!Q", data, pos + 2)
            if pos + header + length > len(data):
                break
            frames.append((first & 0x0F, data[pos + header : pos + header + length]))
            pos += header + length
        if pos < len(data) and not complete_only:
            frames.append((-1, data[pos:]))
        return frames


@dataclass
class Run:
    """What one slow-consumer scenario observed."""

    committed: list[tuple[int, StreamId]] = field(default_factory=list)
    """The own position (shard, position) of each change committed, in commit order."""
    slow_buffer_max: int = 0


def _slow_connection(service: Service) -> Any:
    return next((c for c in service.hub.connections if c.registration.instance == "slow"), None)


@asynccontextmanager
async def _scenario(
    layout_config: Callable[..., Config], start_publisher: PublisherFactory,
) -> AsyncIterator[tuple[Service, RawListener, Feed, Feed, Run]]:
    config = layout_config(PARTITIONS, limits=LIMITS)
    async with start_publisher(config) as service:
        slow = await RawListener.register(service.url, v1("vm", ["nic"], instance="slow"))
        assert slow.reply["bootstrapRoute"] == "/vms" and slow.reply["resumed"] is False
        healthy = await register(service.ws_url, v1("vm", ["nic"], instance="healthy"))
        other = await register(service.ws_url, v2({"network": ["*"]}, instance="other"), "~2")
        assert _slow_connection(service) is not None
        run = Run()
        # Commit batches; the healthy listener reads each one completely before the next.
        while _slow_connection(service) is not None:
            assert len(run.committed) < MAX_ITEMS, "the slow listener was never closed"
            n = len(run.committed)
            ids = [f"{LONG}-{n + i}" for i in range(BATCH)]
            cursors = await service.bucket.commit_many(
                Change.put("vm", id, ["nic"], {"n": n + i}) for i, id in enumerate(ids)
            )
            mine = [own(c, id) for c, id in zip(cursors, ids, strict=True)]
            run.committed += mine
            assert sorted(owns(await healthy.take(BATCH))) == sorted(mine)
            slow_conn = _slow_connection(service)
            if slow_conn is not None:
                size = slow_conn.transport.get_write_buffer_size()
                run.slow_buffer_max = max(run.slow_buffer_max, size)
            assert len(service.hub.window) <= LIMITS["window"]
        try:
            yield service, slow, healthy, other, run
        finally:
            for feed in (healthy, other):
                await feed.close()


def _prefix_in_each_shard(got: list[tuple[int, StreamId]], committed: list[tuple[int, StreamId]]
                          ) -> bool:
    """True when, in each shard, `got` is a prefix of what was committed there, in order."""
    shards = {s for s, _ in committed}
    return all(
        [p for s, p in got if s == shard] == [p for s, p in committed if s == shard][
            : sum(1 for s, _ in got if s == shard)]
        for shard in shards
    )


async def test_slow_consumer_is_closed_with_4008_and_the_others_get_everything(
    layout_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    async with _scenario(layout_config, start_publisher) as (
        service, slow, healthy, other, run
    ):
        # The slow listener is gone from the publisher: not in the stats, not in the hub.
        async with (
            aiohttp.ClientSession() as http,
            http.get(service.url + "/changefeeds/stats") as response,
        ):
            stats = await response.json()
        assert stats["listeners"] == 2
        assert {r["instance"] for r in stats["registrations"]} == {"healthy", "other"}
        assert len(service.hub.connections) == 2
        assert len(service.hub.window) <= LIMITS["window"]

        # Read at once (the publisher aborts a connection that does not take its close frame
        # within CLOSE_GRACE): the items it was sent, in order and without a gap, then 4008.
        assert CLOSE_GRACE >= 1
        frames = await slow.read_to_end()
        *texts, close = frames
        assert close[0] == 0x8, f"expected a close frame last, got opcode {close[0]}"
        code = struct.unpack("!H", close[1][:2])[0]
        reason = close[1][2:].decode()
        assert code == 4008 and reason.startswith("slow consumer"), (code, reason)
        assert all(opcode == 0x1 for opcode, _ in texts)
        items = [orjson.loads(payload) for _, payload in texts]
        got = owns(items)
        assert _prefix_in_each_shard(got, run.committed), "a gap-free prefix in each shard"
        assert 0 < len(got) <= len(run.committed) - LIMITS["window"], "it fell past the window"

        # The healthy listener keeps receiving; the unrelated one got nothing at all.
        last = await service.bucket.commit("vm", "after", ["nic"], {})
        assert owns([await healthy.next()]) == [own(last, "after")]
        net = await service.bucket.commit("network", "n1", ["ips"], {})
        assert owns([await other.next()]) == [own(net, "n1")]

        # It can come back with `since` and gets exactly what it missed, then live items.
        since = items[-1]["cursor"]
        back = await register(service.ws_url, v1("vm", ["nic"], instance="slow", since=since))
        assert back.reply["resumed"] is True
        vector = Position.decode(since)
        missed = [(s, p) for s, p in [*run.committed, own(last, "after")]
                  if p > vector.positions[s]]
        assert sorted(owns(await back.take(len(missed), timeout=15))) == sorted(missed)
        assert await back.quiet()
        await back.close()


async def test_a_stopped_readers_write_buffer_stays_near_the_send_buffer_limit(
    layout_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    async with _scenario(layout_config, start_publisher) as (_, slow, *_, run):
        await slow.read_to_end()  # lets the publisher close it now instead of after CLOSE_GRACE
        frame = 2 + 2 + len(LONG) + 200
        assert run.slow_buffer_max <= LIMITS["sendBuffer"] + 2 * frame, run.slow_buffer_max
