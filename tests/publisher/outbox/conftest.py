"""Fixtures of the outbox tests: one private PostgreSQL for the session (a test that kills it
starts its own), a fresh database per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from changefeed_testing.postgres import PostgresServer
from tests.publisher.outbox.rig import fresh_database


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    yield server
    server.remove()


@pytest.fixture
async def database(postgres: PostgresServer) -> str:
    """The URL of a new database with the outbox installed and a `vms` table."""
    return await fresh_database(postgres.url())
