"""How a websocket that ends badly is counted and logged: one lost without a close frame is its
101 in `changefeed_http_requests_total` and one abnormal closure, never a 500; a frame aiohttp
refuses is logged with the close code the client received. Real sockets, a real publisher."""

from __future__ import annotations

import asyncio
import os
import struct

import orjson
from structlog.testing import capture_logs

from publisher.server.service import Service
from tests.publisher.web.test_admission import _address, _handshake, closed_by_server, sockets
from tests.publisher.web.test_metrics import scrape
from tests.servers import eventually, scaled
from tests.wsclient import register, v1

NOT_UTF8 = b"\xff\xfe not UTF-8"


def masked(opcode: int, payload: bytes) -> bytes:
    """A client frame (FIN set, masked), of a payload under 64 KiB."""
    mask = os.urandom(4)
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    size = len(payload)
    length = struct.pack("!B", 0x80 | size) if size < 126 else struct.pack("!BH", 0xFE, size)
    return struct.pack("!B", 0x80 | opcode) + length + mask + body


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """The payload of the next server frame (unmasked)."""
    head = await asyncio.wait_for(reader.readexactly(2), scaled(10))
    length = head[1] & 0x7F
    if length >= 126:
        extra = await reader.readexactly(2 if length == 126 else 8)
        length = int.from_bytes(extra, "big")
    return await reader.readexactly(length)


def close_code_of(frame: bytes) -> int:
    assert frame[0] == 0x88, frame
    code: int = struct.unpack("!H", frame[2:4])[0]
    return code


async def test_a_websocket_lost_without_a_close_frame_is_its_101_and_one_abnormal_closure(
    publisher: Service,
) -> None:
    host, port = _address(publisher.url)
    feed = await register(publisher.ws_url, v1())
    feed.ws.transport.abort()  # registered, then gone without a close frame
    async with sockets(publisher.url, 1, send=_handshake(host, port)) as [stream]:
        head = await asyncio.wait_for(stream[0].readuntil(b"\r\n\r\n"), scaled(10))
        assert head.startswith(b"HTTP/1.1 101"), head
        stream[1].transport.abort()  # upgraded, gone before registering

    def upgrades() -> dict[str, float]:
        return {
            sample.labels["status"]: sample.value
            for family in publisher.metrics.registry.collect()
            for sample in family.samples
            if sample.name == "changefeed_http_requests_total"
            and sample.labels["route"] == "/changefeeds"
        }

    await eventually(lambda: sum(upgrades().values()) == 2, "both handlers ended")
    assert upgrades() == {"101": 2}
    samples, _, _ = await scrape(publisher)
    assert samples["changefeed_websocket_abnormal_closures_total", ()] == 2


async def test_a_frame_that_is_not_utf8_is_logged_with_the_1007_the_client_received(
    publisher: Service,
) -> None:
    host, port = _address(publisher.url)
    with capture_logs() as logs:
        for registered in (False, True):
            async with sockets(publisher.url, 1, send=_handshake(host, port)) as [stream]:
                reader, writer = stream
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), scaled(10))
                assert head.startswith(b"HTTP/1.1 101"), head
                if registered:
                    writer.write(masked(0x1, orjson.dumps(v1())))
                    await read_frame(reader)  # the registration reply
                writer.write(masked(0x1, NOT_UTF8))
                frame = await asyncio.wait_for(reader.readexactly(4), scaled(10))
                assert close_code_of(frame) == 1007
                writer.write(masked(0x8, struct.pack("!H", 1000)))  # the client's answer
                await closed_by_server(stream)
        await eventually(
            lambda: any(e["event"] == "listener disconnected" for e in logs), "the disconnect"
        )
    [refused] = [e for e in logs if e["event"] == "registration refused"]
    assert refused["code"] == 1007, refused
    [disconnected] = [e for e in logs if e["event"] == "listener disconnected"]
    assert disconnected["code"] == 1007, disconnected
    assert "UTF-8" in disconnected["reason"]
