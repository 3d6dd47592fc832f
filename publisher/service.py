"""The publisher service: the HTTP routes, the websocket fan-out, the tail and the trimmer,
assembled on one aiohttp application."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
from collections.abc import AsyncIterator

import structlog
from aiohttp import web

from changefeed.cursor import ZERO, Cursor, StreamId
from changefeed.errors import BucketUnavailable, ChangefeedError
from changefeed.protocol import CloseCode
from publisher.bucket import ChangeBucket, connect
from publisher.config import Config
from publisher.hub import Hub
from publisher.poll_routes import add_poll_routes
from publisher.routes import add_routes, errors_as_json
from publisher.tail import Tail
from publisher.window import Window

log = structlog.get_logger(__name__)

READY_TIMEOUT = 10.0
"""How long start() waits for the first read of the bucket before serving anyway."""


class Service:
    """A publisher process: `await start()`, then `url`; `await stop()` closes listeners (1001)."""

    def __init__(self, config: Config, publisher_id: str | None = None) -> None:
        if config.bucket.redis_url is None:
            raise ChangefeedError("Service needs a Redis URL (the CLI starts an embedded Redis)")
        self.config = config
        self.resources = config.resource_map
        self.id = publisher_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"
        self.redis_url = config.bucket.redis_url
        bucket = config.bucket
        self.bucket = ChangeBucket(
            connect(self.redis_url), bucket.name, config.resources, bucket.partitions
        )
        self._tail_bucket = ChangeBucket(
            connect(self.redis_url, blocking=True), bucket.name, config.resources, bucket.partitions
        )
        self.hub = Hub(Window(config.limits.window, ZERO), self.bucket, config.limits.send_buffer)
        self.tail = Tail(self._tail_bucket, self.hub)
        self.app = web.Application(middlewares=[errors_as_json])
        add_routes(self.app, self)
        add_poll_routes(self.app, self)
        self.app.cleanup_ctx.append(self._background)
        self.app.on_shutdown.append(self._close_listeners)
        self.unregistered: set[web.WebSocketResponse] = set()
        """Sockets still expected to send their registration."""
        self._runner: web.AppRunner | None = None
        self.url = ""

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://", 1) + "/changefeeds"

    async def start(self) -> None:
        """Serve. Raises PartitionMismatch when the bucket has another partition count than
        configured (a Redis that cannot be reached yet is waited for in the background)."""
        with contextlib.suppress(BucketUnavailable):
            await self.bucket.ensure()
        # handler_cancellation: a long poll whose client went away stops waiting at once.
        self._runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, handler_cancellation=True
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.server.host, self.config.server.port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.tail.started.wait(), READY_TIMEOUT)
        if not self.tail.started.is_set():
            log.warning("bucket not reachable yet; serving, registrations are refused (1013)")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def resume_position(self, cursor: Cursor) -> StreamId | None:
        """Where a registration with `since=cursor` resumes, or None if it cannot."""
        if cursor.epoch != self.hub.epoch:
            return None
        retention = await self.bucket.retention()
        # Redis's epoch too: another publisher may have started a new one (a rollback) that
        # this one's tail has not read yet.
        if cursor.epoch != retention.epoch:
            return None
        if cursor.position < retention.trimmed or cursor.position > retention.head:
            return None
        return cursor.position

    async def _background(self, app: web.Application) -> AsyncIterator[None]:
        tasks = [
            asyncio.create_task(self.tail.run(), name="tail"),
            asyncio.create_task(self._trim_forever(), name="trim"),
        ]
        yield
        self.tail.stop()
        tasks[1].cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.bucket.aclose()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._tail_bucket.aclose(), 1.0)

    async def _trim_forever(self) -> None:
        interval = self.config.trim_every
        while True:
            await asyncio.sleep(interval)
            try:
                removed = await self.bucket.trim(self.config.max_age, self.config.max_items)
            except BucketUnavailable as exc:
                log.warning("gc skipped: bucket unavailable", error=str(exc))
                continue
            (log.info if removed else log.debug)(
                "gc run",
                removed=removed,
                max_age=self.config.max_age,
                max_items=self.config.max_items,
            )

    async def _close_listeners(self, app: web.Application) -> None:
        self.hub.release_waiters()  # long polls answer now instead of holding the shutdown up
        conns = list(self.hub.connections)
        if conns:
            log.info("closing listeners: shutting down", listeners=len(conns))
        for conn in conns:
            self.hub.close_now(conn, CloseCode.GOING_AWAY, "publisher shutting down")
        for ws in list(self.unregistered):
            await ws.close(code=CloseCode.GOING_AWAY, message=b"publisher shutting down")
        self.unregistered.clear()
