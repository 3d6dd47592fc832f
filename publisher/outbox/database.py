"""The relay's connections to PostgreSQL (asyncpg), and the one place where asyncpg's errors
become ours (`translate_postgres_errors`).

asyncpg comes with the `postgres` extra: without it this module still imports (the publisher
imports it whatever config.js says), and config.js's `outbox` is refused at load
(publisher.config.extras)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from changefeed.errors import OutboxError
from publisher.config.extras import POSTGRES, require

try:
    import asyncpg
except ImportError:  # the postgres extra is not installed
    asyncpg = None

CONNECT_TIMEOUT = 5.0
"""Seconds a connection attempt may take."""
KEEPALIVES = {
    "tcp_keepalives_idle": "5",
    "tcp_keepalives_interval": "2",
    "tcp_keepalives_count": "3",
}
"""The server's keepalives on the relay's sessions: a relay whose host vanished loses its
session, and so its lock, within about 11 s (another takes over)."""
APPLICATION = "changefeed-relay"
"""The application_name prefix of the relaying session (`changefeed outbox status` shows it)."""
LISTENING = "changefeed-listen"
"""The application_name prefix of the relay's LISTEN session."""
HOUSEKEEPING = "changefeed-housekeeping"
"""The application_name prefix of the relaying publisher's housekeeping session."""

ERRORS: tuple[type[BaseException], ...] = (OSError, asyncio.TimeoutError) + (
    ()
    if asyncpg is None
    else (
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        asyncpg.exceptions._base.InternalClientError,  # a connection left mid-operation
    )
)
"""What a PostgreSQL connection or statement may raise: the server or the network failed."""


@asynccontextmanager
async def translate_postgres_errors(what: str) -> AsyncIterator[None]:
    """Raise asyncpg's (and the network's) errors inside as OutboxError naming `what`."""
    try:
        yield
    except ERRORS as exc:
        raise OutboxError(f"{what}: {type(exc).__name__}: {exc}", exc) from exc


async def connect(url: str, name: str | None = None, role: str = APPLICATION) -> Any:
    """An asyncpg connection to `url`, its session named `<role> <name>`."""
    require("outbox", POSTGRES)
    settings = dict(KEEPALIVES)
    settings["application_name"] = f"{role} {name}"[:63] if name else role
    async with translate_postgres_errors("connect to the outbox's PostgreSQL"):
        return await asyncpg.connect(url, timeout=CONNECT_TIMEOUT, server_settings=settings)


CLOSE_TIMEOUT = 1.0
"""Seconds a graceful close may take before the connection is dropped."""


async def close(conn: Any) -> None:
    """Close `conn`, or drop it when the server does not answer within CLOSE_TIMEOUT; when
    cancelled meanwhile, drop it and raise the cancellation (not swallow it, as
    `asyncio.wait_for` could before Python 3.12)."""
    try:
        await conn.close(timeout=CLOSE_TIMEOUT)
    except ERRORS:
        conn.terminate()
    except BaseException:
        conn.terminate()
        raise
