"""The tail's own Redis connection, read without redis-py's command layers.

The tail makes one read per change it fans out when changes come one at a time, so what a read
costs in Python is paid per change (docs/benchmarks.md, P1'). A `TailChannel` takes one
connection from the tail's pool, which connects, authenticates, selects the database and asks
the sentinels for the master exactly as for any other command, and keeps it: each exchange
writes a packed pipeline to the connection's stream and parses the replies off it (hiredis's
reader, else `publisher.bucket.resp.RespReader`) in the caller's task. No pool checkout and
release per read, no timeout context per reply, no per-command objects.

A connection that fails is dropped (disconnected and given back to the pool, which opens a new
one next time). A kept connection found dead at the next exchange (Redis restarted meanwhile) is
replaced once, as redis-py does for its own commands: the exchanges are reads. An exchange not
answered within the connection's `socket_timeout` (Redis paused or unreachable) is aborted by a
watchdog that looks once a second, rather than by a timer per exchange, and is not retried.
`abandon` ends a pending exchange at once (the tail is stopping).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.connection import AbstractConnection

from publisher.bucket.resp import Reader, reader

READ_SIZE = 65536
WATCH_EVERY = 1.0
"""Seconds between the watchdog's looks at the exchange in progress."""


class TailChannel:
    """One pooled connection kept for the tail's pipelined reads."""

    def __init__(self, pool: aioredis.ConnectionPool) -> None:
        self.pool = pool
        self._connection: AbstractConnection | None = None
        self._parser: Reader = reader()
        self._abandoned = False
        self._sent_at = 0.0
        """When (`time.monotonic()`) the exchange in progress was sent (0: none in progress)."""
        self._timed_out = False
        self._watchdog: asyncio.TimerHandle | None = None

    async def exchange(self, command: bytes, replies: int) -> list[Any]:
        """Send `command` (RESP, possibly several commands) and return its `replies` replies;
        an error reply is returned as its redis-py exception, not raised."""
        for attempt in (1, 2):
            kept = self._connection is not None
            connection = self._connection or await self._take()
            try:
                return await self._exchange(connection, command, replies)
            except (redis.exceptions.ConnectionError, OSError) as exc:
                await self.drop()
                if self._timed_out:
                    self._timed_out = False
                    raise redis.exceptions.TimeoutError(
                        "Timeout reading from the tail's Redis connection"
                    ) from None
                if not kept or attempt == 2 or self._abandoned:
                    if isinstance(exc, redis.exceptions.ConnectionError):
                        raise
                    raise redis.exceptions.ConnectionError(
                        f"the tail's Redis connection failed: {exc}"
                    ) from exc
            except BaseException:
                await self.drop()  # cancelled mid-exchange: its replies would come later
                raise
        raise AssertionError("unreachable")

    async def _take(self) -> AbstractConnection:
        connection: AbstractConnection = await self.pool.get_connection()  # type: ignore[no-untyped-call]
        self._connection = connection
        self._parser = reader()
        if self._watchdog is None and connection.socket_timeout:
            loop = asyncio.get_running_loop()
            self._watchdog = loop.call_later(WATCH_EVERY, self._watch, connection.socket_timeout)
        return connection

    def _watch(self, timeout: float) -> None:
        """Abort the connection under an exchange older than `timeout` seconds; look again in
        `WATCH_EVERY` seconds while a connection is kept."""
        self._watchdog = None
        connection = self._connection
        if connection is None:
            return
        loop = asyncio.get_running_loop()
        sent_at = self._sent_at
        if sent_at and time.monotonic() - sent_at > timeout and connection._writer is not None:
            self._timed_out = True
            connection._writer.transport.abort()
        self._watchdog = loop.call_later(WATCH_EVERY, self._watch, timeout)

    async def _exchange(
        self, connection: AbstractConnection, command: bytes, replies: int
    ) -> list[Any]:
        stream, writer = connection._reader, connection._writer
        if stream is None or writer is None:
            raise redis.exceptions.ConnectionError("the tail's Redis connection is closed")
        writer.write(command)
        self._sent_at = time.monotonic()
        parser = self._parser
        out: list[Any] = []
        try:
            while len(out) < replies:
                reply = parser.gets()
                if reply is False:
                    data = await stream.read(READ_SIZE)
                    if not data:
                        raise redis.exceptions.ConnectionError(
                            "Redis closed the tail's connection"
                        )
                    parser.feed(data)
                else:
                    out.append(reply)
        finally:
            self._sent_at = 0.0
        return out

    def abandon(self) -> None:
        """End a pending exchange now (it fails with a ConnectionError): the tail stops."""
        self._abandoned = True
        connection = self._connection
        if connection is not None and connection._writer is not None:
            connection._writer.transport.abort()

    async def drop(self) -> None:
        """Disconnect the kept connection and give it back to the pool."""
        connection, self._connection = self._connection, None
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if connection is not None:
            await connection.disconnect(nowait=True)
            await self.pool.release(connection)


__all__ = ["READ_SIZE", "WATCH_EVERY", "TailChannel"]
