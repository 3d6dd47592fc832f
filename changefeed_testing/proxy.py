"""TCP proxies that simulate network faults: `Proxy` (steered by a scenario) and `SlowSocket` (the
testing kit's slow network between a listener and a publisher).

`Proxy`: an asyncio TCP proxy that a test steers to simulate network faults.

It listens on 127.0.0.1 (a free port) and forwards every connection to a target. Modes:

- `pass_through()`: bytes flow both ways.
- `blackhole()`: connections stay open and new ones are accepted, but nothing is forwarded;
  bytes wait in the proxy and in the kernel's buffers, as they would in a partitioned network
  where TCP keeps retransmitting. `pass_through()` lets them flow again, in order.
  `blackhole(replies_only=True)` forwards requests but holds the target's replies.
- `drip(bytes_per_second)`: bytes flow, slowly.
- `cut(refuse_new=True)`: every connection is aborted now (the peers see a reset); new ones are
  closed as soon as they are accepted until the mode changes (`refuse_new=False`: new ones pass).

Controlled in-process: the scenario calls the methods from its own event loop.

`SlowSocket` is a `Proxy` that drips from the start:

    async with SlowSocket("127.0.0.1", 8080, bytes_per_second=2000) as slow:
        listener = Listener(slow.url, ...)   # every byte both ways drips through the proxy
        slow.rate = None                     # full speed again, for connections open and new
"""

from __future__ import annotations

import asyncio
import contextlib
from enum import Enum
from typing import Any

CHUNK = 65536
DRIP_TICK = 0.05


class Mode(Enum):
    PASS = "pass"
    BLACKHOLE = "blackhole"
    DRIP = "drip"
    CUT = "cut"


class Proxy:
    """`async with Proxy(host, port) as proxy:` forwards `proxy.port` to `host:port`. It
    listens on `listen` (default the loopback; a network namespace reaches it on its veth's
    host end, `changefeed_testing.netns`)."""

    def __init__(self, target_host: str, target_port: int, *, listen: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.listen = listen
        self.mode = Mode.PASS
        self._rate = 0
        self.refuse_new = False
        self.accepted = 0
        self.forwarded = 0
        self._requests = asyncio.Event()
        self._replies = asyncio.Event()
        self._requests.set()
        self._replies.set()
        self.holding = asyncio.Event()
        """Set when bytes arrived that a blackhole holds back (e.g. a reply was produced)."""
        self._server: asyncio.Server | None = None
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        """The connections' own tasks (asyncio's, one per accepted connection): aclose waits
        for them, so none is left for the event loop to cancel at its end."""

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        """The proxy as an http:// URL (what a Listener is given)."""
        return f"http://{self.listen}:{self.port}"

    async def __aenter__(self) -> Proxy:
        self._server = await asyncio.start_server(self._accept, self.listen, 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def pass_through(self) -> None:
        self._set(Mode.PASS)

    def blackhole(self, *, replies_only: bool = False) -> None:
        self.holding.clear()
        self._set(Mode.BLACKHOLE)
        if replies_only:
            self._requests.set()

    def drip(self, bytes_per_second: int) -> None:
        if bytes_per_second <= 0:
            raise ValueError(f"bytes_per_second must be positive, not {bytes_per_second}")
        self._rate = bytes_per_second
        self._set(Mode.DRIP)

    @property
    def rate(self) -> int | None:
        """Bytes per second each way while dripping; None when not dripping. Setting it drips
        at that rate (None: full speed), for open connections and new ones alike."""
        return self._rate if self.mode is Mode.DRIP else None

    @rate.setter
    def rate(self, bytes_per_second: int | None) -> None:
        if bytes_per_second is None:
            self.pass_through()
        else:
            self.drip(bytes_per_second)

    def cut(self, *, refuse_new: bool = True) -> None:
        """Abort every connection now; refuse (accept and abort) new ones while cut."""
        self.refuse_new = refuse_new
        self._set(Mode.CUT if refuse_new else Mode.PASS)
        self._abort_links()

    def retarget(self, host: str, port: int, *, keep_open: bool = False) -> None:
        """Forward new connections to `host:port` from now on, and abort the open ones (they
        lead to the old target) unless `keep_open` (a split brain: the connections made before
        still reach the old master); the mode (a blackhole, a drip) stays as it is."""
        self.target = (host, port)
        if not keep_open:
            self._abort_links()

    def _abort_links(self) -> None:
        """Abort every open connection, both of its ends."""
        for client, upstream in list(self._links):
            client.transport.abort()
            upstream.transport.abort()
        self._links.clear()

    @property
    def connections(self) -> int:
        return len(self._links)

    def _set(self, mode: Mode) -> None:
        self.mode = mode
        for gate in (self._requests, self._replies):
            if mode is Mode.BLACKHOLE:
                gate.clear()
            else:
                gate.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
            handler.add_done_callback(self._handlers.discard)
        if self.mode is Mode.CUT:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        link = (writer, up_writer)
        self._links.add(link)
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer, self._requests)),
            asyncio.create_task(self._pump(up_reader, writer, self._replies)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._tasks.difference_update(pumps)
            self._links.discard(link)
            for end in link:
                end.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    gate: asyncio.Event) -> None:
        """Copy one direction, obeying `gate` and the mode before every chunk it forwards."""
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(CHUNK):
                while data:
                    if not gate.is_set():
                        self.holding.set()
                        await gate.wait()
                    if self.mode is Mode.DRIP:
                        piece = data[: max(1, int(self._rate * DRIP_TICK))]
                        writer.write(piece)
                        await writer.drain()
                        await asyncio.sleep(DRIP_TICK)  # the drip's pace, not a readiness wait
                    else:
                        piece = data
                        writer.write(piece)
                        await writer.drain()
                    data = data[len(piece):]
                    self.forwarded += len(piece)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut(refuse_new=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


class SlowSocket(Proxy):
    """`async with SlowSocket(host, port, bytes_per_second) as proxy:` forwards `proxy.port`
    to `host:port`, dripping `bytes_per_second` each way (None: as fast as it can)."""

    def __init__(self, target_host: str, target_port: int, bytes_per_second: int | None) -> None:
        super().__init__(target_host, target_port)
        self.rate = bytes_per_second


__all__ = ["Mode", "Proxy", "SlowSocket"]
