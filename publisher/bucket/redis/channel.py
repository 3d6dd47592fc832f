"""A kept Redis connection, read without redis-py's command layers: the tail's reads and the
single commits.

The tail makes one read per change it fans out when changes come one at a time, and a service
committing one change at a time makes one commit.lua call each, so what one exchange costs in
Python is paid per change (docs/benchmarks.md, P1' and P3). A `Channel` takes one connection
from its bucket's pool (which connects, authenticates, selects the database and asks the
sentinels for the master exactly as for any other command) and keeps it: each exchange writes
packed RESP to the connection's stream and parses the replies off it (hiredis's reader, else
`publisher.bucket.redis.resp.RespReader`) in the caller's task. No pool checkout and release
per call, no timeout context per reply, no per-command objects. One exchange at a time: `busy`
says when one is in progress (a concurrent caller uses the pool instead).

A connection that fails is dropped (disconnected and given back to the pool, which opens a new
one next time). A kept connection seen closed before an exchange is replaced before anything is
sent. One found dead only by the exchange (Redis restarted meanwhile) is replaced and the
exchange sent again when the caller says it may be (`retry`: reads; never a commit, which is
not idempotent). An exchange not answered within the connection's `socket_timeout` (Redis
paused or unreachable) is aborted by a watchdog that looks once a second, rather than by a
timer per exchange, and fails with redis-py's TimeoutError; it is not sent again. A connection
answered READONLY (its Redis was made a replica: a Sentinel failover) is dropped too, so that
the next exchange goes to the master the pool finds. `abandon` ends an exchange in progress at
once, and every later one (its caller is stopping).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.connection import AbstractConnection

from publisher.bucket.redis.resp import Reader, reader

READ_SIZE = 65536
WATCH_EVERY = 1.0
"""Seconds between the watchdog's looks at the exchange in progress."""


class Sent(Exception):
    """An exchange failed after its command was written (`__cause__`: the redis-py error): for a
    commit, the outcome is unknown."""


class Channel:
    """One pooled connection kept for exchanges one at a time."""

    def __init__(self, pool: aioredis.ConnectionPool, name: str) -> None:
        self.pool = pool
        self.name = name
        """What the connection is for, in errors ("tail", "commit")."""
        self.busy = False
        self._connection: AbstractConnection | None = None
        self._parser: Reader = reader()
        self._abandoned = False
        self._sent_at = 0.0
        """When (`time.monotonic()`) the exchange in progress was sent (0: none in progress)."""
        self._timed_out = False
        self._watchdog: asyncio.TimerHandle | None = None
        self.socket: object | None = None
        """The stream writer of the last exchange's connection: what it was sent over (a commit's
        witness is kept per socket, as one socket leads to one Redis)."""

    async def exchange(self, command: bytes, replies: int, *, retry: bool) -> list[Any]:
        """Send `command` (RESP, possibly several commands) and return its `replies` replies;
        an error reply is returned as its redis-py exception, not raised. Fails with redis-py's
        errors when nothing was sent, and with `Sent` (from them) once `command` was written."""
        self.busy = True
        try:
            for attempt in (1, 2):
                if not self._abandoned:
                    connection = await self._live()
                if self._abandoned:  # before or while connecting: send nothing
                    raise redis.exceptions.ConnectionError(
                        f"the {self.name}'s exchanges were abandoned"
                    )
                try:
                    out = await self._exchange(connection, command, replies)
                    if any(isinstance(reply, redis.exceptions.ReadOnlyError) for reply in out):
                        await self.drop()  # a demoted master: the pool finds the new one
                    return out
                except (redis.exceptions.ConnectionError, OSError) as exc:
                    await self.drop()
                    if self._timed_out:
                        self._timed_out = False
                        raise Sent from redis.exceptions.TimeoutError(
                            f"Timeout reading from the {self.name}'s Redis connection"
                        )
                    if not retry or attempt == 2 or self._abandoned:
                        if not isinstance(exc, redis.exceptions.ConnectionError):
                            exc = redis.exceptions.ConnectionError(
                                f"the {self.name}'s Redis connection failed: {exc}"
                            )
                        raise Sent from exc
                except BaseException:
                    await self.drop()  # cancelled mid-exchange: its replies would come later
                    raise
            raise AssertionError("unreachable")
        finally:
            self.busy = False

    async def _live(self) -> AbstractConnection:
        """The kept connection, or a new one from the pool when there is none or the kept one
        was closed meanwhile (seen by the event loop: nothing is sent on it)."""
        kept = self._connection
        if kept is not None:
            if self._open(kept):
                return kept
            await self.drop()
        connection: AbstractConnection = await self.pool.get_connection()  # type: ignore[no-untyped-call]
        self._connection = connection
        self._parser = reader()
        if self._watchdog is None and connection.socket_timeout:
            loop = asyncio.get_running_loop()
            self._watchdog = loop.call_later(WATCH_EVERY, self._watch, connection.socket_timeout)
        return connection

    @staticmethod
    def _open(connection: AbstractConnection) -> bool:
        """Whether `connection` is open, as far as the event loop has seen."""
        stream, writer = connection._reader, connection._writer
        return (stream is not None and writer is not None and not stream.at_eof()
                and not writer.transport.is_closing())

    @property
    def next_socket(self) -> object | None:
        """The socket the next exchange goes over when it starts now: the kept connection's
        while it is open, else None (a new connection's, not known yet)."""
        kept = self._connection
        return kept._writer if kept is not None and self._open(kept) else None

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
            raise redis.exceptions.ConnectionError(f"the {self.name}'s Redis connection is closed")
        writer.write(command)
        self.socket = writer
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
                            f"Redis closed the {self.name}'s connection"
                        )
                    parser.feed(data)
                else:
                    out.append(reply)
        finally:
            self._sent_at = 0.0
        return out

    def abandon(self) -> None:
        """End the exchange in progress now, and fail every later one at once: the caller is
        stopping (an exchange whose command was written fails with `Sent`, any other with
        redis-py's ConnectionError, before anything is sent)."""
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


__all__ = ["READ_SIZE", "WATCH_EVERY", "Channel", "Sent"]
