"""What the capture tests share: the server settings logical replication needs, a fresh
database per test, and SQL run on a plain psycopg2 connection."""

from __future__ import annotations

import itertools
import time
from typing import Any

import psycopg2

LOGICAL = {
    "wal_level": "logical", "max_replication_slots": "20", "max_wal_senders": "20",
    "wal_sender_timeout": "10s",
}
"""What the capture needs of the server (more slots and senders than tests use at once)."""
_names = itertools.count()


def fresh_database(admin_url: str) -> str:
    """A new, empty database; returns its URL."""
    name = f"c{next(_names)}_{int(time.time() * 1000) % 100000}"
    conn = psycopg2.connect(admin_url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
    finally:
        conn.close()
    return admin_url.rsplit("/", 1)[0] + "/" + name


def sql(url: str, *statements: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run `statements` in one transaction; the rows of the last one (or [])."""
    conn = psycopg2.connect(url)
    try:
        with conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement, args or None)
            return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()
