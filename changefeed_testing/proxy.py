"""A slow socket: a TCP proxy on a free port that forwards to a target at a limited byte rate.

    async with SlowSocket("127.0.0.1", 8080, bytes_per_second=2000) as slow:
        listener = Listener(slow.url, ...)   # every byte both ways drips through the proxy
        slow.rate = None                     # full speed again, for connections open and new

Each direction of each connection is copied in slices of `rate * TICK` bytes, one slice per
`TICK` seconds; the kernel's socket buffers then push back on the writer as a slow network
would. The rate is read before every slice, so changing it applies at once.
"""

from __future__ import annotations

import asyncio
import contextlib

CHUNK = 65536
TICK = 0.02
"""Seconds between two slices of a dripping copy."""


class SlowSocket:
    """`async with SlowSocket(host, port, bytes_per_second) as proxy:` forwards `proxy.port`
    to `host:port`, dripping `bytes_per_second` each way (None: as fast as it can)."""

    def __init__(self, target_host: str, target_port: int, bytes_per_second: int | None) -> None:
        if bytes_per_second is not None and bytes_per_second <= 0:
            raise ValueError(f"bytes_per_second must be positive or None, not {bytes_per_second}")
        self.target = (target_host, target_port)
        self.rate = bytes_per_second
        self.forwarded = 0
        """Bytes forwarded so far, both directions."""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None, "not started: use `async with`"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        """The proxy as an http:// URL: what a Listener is given instead of the publisher's."""
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> SlowSocket:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop accepting and abort every connection (the peers see a reset)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        upstream: asyncio.StreamWriter | None = None
        pumps: list[asyncio.Task[None]] = []
        try:
            up_reader, upstream = await asyncio.open_connection(*self.target)
            pumps = [
                asyncio.create_task(self._pump(reader, upstream)),
                asyncio.create_task(self._pump(up_reader, writer)),
            ]
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        except OSError:
            pass  # the target refused: the client sees its connection reset, as it would
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._tasks.discard(task)
            for end in (writer, upstream):
                if end is not None:
                    end.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction until EOF or an error."""
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(CHUNK):
                while data:
                    rate = self.rate
                    piece = data if rate is None else data[: max(1, int(rate * TICK))]
                    writer.write(piece)
                    await writer.drain()
                    self.forwarded += len(piece)
                    data = data[len(piece) :]
                    if rate is not None:
                        await asyncio.sleep(TICK)  # the drip's pace, not a readiness wait
