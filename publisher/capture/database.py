"""The capture's connections to PostgreSQL (psycopg2: a plain one and a logical replication
one), and the one place where psycopg2's errors become ours (`translate_postgres_errors`).

Blocking code: the capture runs it in a thread of its own (publisher.capture.session).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg2
import psycopg2.extras

from changefeed.errors import CaptureError

CONNECT_TIMEOUT = 5
"""Seconds a connection attempt may take."""
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
              "keepalives_count": 3}
"""The client's TCP keepalives: a session whose server vanished fails within about 11 s."""
APPLICATION = "changefeed-capture"
"""The application_name prefix of the capture's sessions (`changefeed capture status`)."""
ERRORS: tuple[type[BaseException], ...] = (OSError, psycopg2.Error)
"""What a PostgreSQL connection or statement may raise: the server or the network failed, or
the server refused."""


@contextmanager
def translate_postgres_errors(what: str) -> Iterator[None]:
    """Raise psycopg2's (and the network's) errors inside as CaptureError naming `what`."""
    try:
        yield
    except ERRORS as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CaptureError(f"{what}: {text}", exc) from exc


def connect(url: str, name: str | None = None, *, replication: bool = False) -> Any:
    """A psycopg2 connection to `url` (autocommit), its session named `changefeed-capture
    <name>`; with `replication`, a logical replication connection."""
    application = f"{APPLICATION} {name}"[:63] if name else APPLICATION
    factory = psycopg2.extras.LogicalReplicationConnection if replication else None
    with translate_postgres_errors("connect to the capture's PostgreSQL"):
        conn = psycopg2.connect(url, connect_timeout=CONNECT_TIMEOUT,
                                application_name=application, connection_factory=factory,
                                **KEEPALIVES)
        if not replication:
            conn.autocommit = True
    return conn


def close(conn: Any) -> None:
    """Close `conn` (whatever state it is in)."""
    if conn is not None:
        with suppress(*ERRORS):
            conn.close()


def query(conn: Any, statement: str, *args: Any) -> list[tuple[Any, ...]]:
    """The rows of `statement` on a plain connection."""
    with conn.cursor() as cur:
        cur.execute(statement, args or None)
        return list(cur.fetchall()) if cur.description else []
