"""What a stranger can make the publisher hold: idle and half-sent connections are closed after
their timeouts, connections are capped in total and per client address (503 past the cap, one log
line per client and interval), the cap fits the open-file limit so accepting never fails, and
unmasked client frames are refused with 1002. Real sockets against real publishers."""

from __future__ import annotations

import asyncio
import base64
import os
import resource
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import aiohttp
import orjson
from structlog.testing import capture_logs

from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.servers import PublisherProcess, RedisServer, eventually, scaled, write_config
from tests.wsclient import register, v1

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname and parts.port
    return parts.hostname, parts.port


@asynccontextmanager
async def sockets(
    url: str, count: int, source: str = "127.0.0.1", send: bytes = b""
) -> AsyncIterator[list[Stream]]:
    host, port = _address(url)
    opened = []
    try:
        for _ in range(count):
            reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
            if send:
                writer.write(send)
            opened.append((reader, writer))
        yield opened
    finally:
        for _, writer in opened:
            writer.close()


async def closed_by_server(stream: Stream) -> bytes:
    """Everything the server sends until it closes the connection."""
    return await asyncio.wait_for(stream[0].read(), scaled(10))


async def get(url: str, path: str = "/changefeeds") -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as http, http.get(url + path) as response:
        return response.status, dict(response.headers), await response.read()


def refused_503(answer: bytes) -> dict[str, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 "), answer[:200]
    assert b"Retry-After: 1" in head
    error: dict[str, str] = orjson.loads(body)
    assert error["code"] == "TooManyConnections"
    return error


async def test_idle_and_half_sent_connections_are_closed(
    redis_server: RedisServer, make_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    config = make_config(redis_server.url, server={"host": "127.0.0.1", "port": 0,
                                                   "idleTimeout": 0.3, "bodyTimeout": 0.3})
    async with start_publisher(config) as service:
        half_head = b"GET /vms HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
        half_body = (b"POST /changefeeds/rpc HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 100\r\n\r\n{\"jsonrpc\"")
        async with (
            sockets(service.url, 20) as idle,
            sockets(service.url, 5, send=half_head) as heads,
            sockets(service.url, 2, send=half_body) as bodies,
        ):
            for stream in idle + heads:
                assert await closed_by_server(stream) == b"", "closed without an answer"
            for stream in bodies:
                answer = await closed_by_server(stream)
                assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
                assert b'"code":"RequestTimeout"' in answer and b"server.bodyTimeout" in answer
        await eventually(lambda: service.admission.open == 0, "every connection released")
        assert (await get(service.url))[0] == 200


async def test_connections_are_capped_per_client_and_in_total(
    redis_server: RedisServer, make_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    config = make_config(redis_server.url, server={
        "host": "127.0.0.1", "port": 0, "maxConnections": 5, "maxConnectionsPerClient": 3})
    async with start_publisher(config) as service:
        with capture_logs() as logs:
            async with sockets(service.url, 3) as mine:
                async with sockets(service.url, 2) as over:
                    for stream in over:
                        error = refused_503(await closed_by_server(stream))
                        assert "server.maxConnectionsPerClient" in error["message"]
                async with sockets(service.url, 2, source="127.0.0.2") as other:
                    other[0][1].write(b"GET /changefeeds HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    line = await asyncio.wait_for(other[0][0].readline(), scaled(10))
                    assert line.startswith(b"HTTP/1.1 200"), "another client is served"
                    async with sockets(service.url, 1, source="127.0.0.3") as third:
                        error = refused_503(await closed_by_server(third[0]))
                        assert "server.maxConnections)" in error["message"]
                assert mine
        refusals = [e for e in logs if e["event"] == "connection refused"]
        assert [e["client"] for e in refusals] == ["127.0.0.1", "127.0.0.3"], (
            "one line per client and interval")
        await eventually(lambda: service.admission.open == 0, "every connection released")
        assert (await get(service.url))[0] == 200, "served again below the cap"


async def test_the_cap_fits_the_open_file_limit_and_accept_never_fails(
    redis_server: RedisServer, tmp_path: os.PathLike[str]
) -> None:
    """The reported outage: with 256 open files allowed, thousands of idle connections made
    accept() fail and health checks time out. Now the cap stays below the limit: the surplus
    gets 503 at once, and the publisher serves as soon as connections go."""
    config = write_config(tmp_path / "config.js", redis_server.url)  # type: ignore[operator]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # inherited by the publisher
    try:
        publisher = PublisherProcess(config).start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        assert "server.maxConnections lowered to fit the open-file limit" in publisher.output()
        async with sockets(publisher.url, 300) as many:
            status, headers, body = await get(publisher.url)
            assert status == 503 and headers["Retry-After"] == "1", body
            assert many
        async def served() -> bool:
            return (await get(publisher.url))[0] == 200
        for _ in range(100):
            if await served():
                break
            await asyncio.sleep(0.05)
        assert await served()
        assert "out of system resource" not in publisher.output()
    finally:
        publisher.stop()


def _handshake(host: str, port: int) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET /changefeeds HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        "Accept-Version: ~1\r\n\r\n"
    ).encode()


def _unmasked_text(payload: bytes) -> bytes:
    return struct.pack("!BB", 0x81, len(payload)) + payload


async def test_an_unmasked_client_frame_is_closed_with_1002(publisher: Service) -> None:
    host, port = _address(publisher.url)
    with capture_logs() as logs:
        async with sockets(publisher.url, 1, send=_handshake(host, port)) as [stream]:
            head = await asyncio.wait_for(stream[0].readuntil(b"\r\n\r\n"), scaled(10))
            assert head.startswith(b"HTTP/1.1 101"), head
            stream[1].write(_unmasked_text(orjson.dumps(v1())))
            frame = await closed_by_server(stream)
        assert frame[0] == 0x88, frame
        code = struct.unpack("!H", frame[2:4])[0]
        assert code == 1002 and b"must be masked" in frame[4:]
        await eventually(lambda: any(e["event"] == "registration refused" for e in logs),
                         "the refusal is logged")
    refused = next(e for e in logs if e["event"] == "registration refused")
    assert refused["code"] == 1002 and "masked" in refused["reason"]
    # Masked frames (every real client) are fine.
    feed = await register(publisher.ws_url, v1())
    assert feed.reply["resource"] == "vm"
    await feed.close()


async def test_a_dropped_listener_is_not_logged_as_a_shutdown(publisher: Service) -> None:
    with capture_logs() as logs:
        feed = await register(publisher.ws_url, v1())
        feed.ws.transport.abort()  # gone without a close frame
        await eventually(
            lambda: any(e["event"] == "listener disconnected" for e in logs), "the disconnect")
    [line] = [e for e in logs if e["event"] == "listener disconnected"]
    assert line["reason"] == "connection lost (no close frame)"
