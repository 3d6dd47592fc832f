"""Fixtures of the capture tests: one private PostgreSQL with `wal_level = logical` for the
session (changefeed_testing.postgres; a test that kills it starts its own), a fresh database
per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from changefeed_testing.postgres import PostgresServer
from tests.publisher.capture.rig import LOGICAL, fresh_database


@pytest.fixture(scope="session")
def logical_postgres() -> Iterator[PostgresServer]:
    server = PostgresServer(LOGICAL).start()
    yield server
    server.remove()


@pytest.fixture
def database(logical_postgres: PostgresServer) -> str:
    """The URL of a new database (its tables are the test's)."""
    return fresh_database(logical_postgres.url())
