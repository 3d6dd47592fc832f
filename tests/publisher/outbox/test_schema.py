"""The SQL contract: install (idempotent, versioned), the three functions inside a transaction,
rollback, and the refusals that fail the service's transaction at the call."""

from __future__ import annotations

import asyncpg
import psycopg
import pytest

from changefeed.errors import OutboxError
from changefeed.watch import MAX_ID_BYTES
from publisher import outbox
from publisher.outbox.schema import VERSION, install


async def rows(conn: asyncpg.Connection) -> list[tuple[object, ...]]:
    found = await conn.fetch(
        "SELECT resource, changed_id, sub_resources, op, state::text FROM changefeed.outbox "
        "ORDER BY id"
    )
    return [tuple(r) for r in found]


async def test_install_is_idempotent_and_versioned(database: str) -> None:
    conn = await asyncpg.connect(database)
    try:
        again = await install(conn)  # the fixture installed it once already
        assert (again.before, again.after) == (VERSION, VERSION)
        assert await conn.fetchval("SELECT count(*) FROM changefeed.outbox_schema") == 1
        await conn.execute("UPDATE changefeed.outbox_schema SET version = $1", VERSION + 1)
        with pytest.raises(OutboxError, match="newer than this release"):
            await install(conn)
        assert await conn.fetchval("SELECT version FROM changefeed.outbox_schema") == VERSION + 1
    finally:
        await conn.close()


async def test_functions_append_rows_inside_the_transaction(database: str) -> None:
    conn = await asyncpg.connect(database)
    try:
        async with conn.transaction():
            first = await outbox.put(conn, "vm", "vm-1", ["nic"], {"uuid": "vm-1"})
            second = await outbox.delete(conn, "vm", "vm-2", ["state"])
            third = await outbox.publish(conn, "vm", "vm-3", ["alias", "nic"])
        assert first < second < third
        assert await rows(conn) == [
            ("vm", "vm-1", ["nic"], "put", '{"uuid": "vm-1"}'),
            ("vm", "vm-2", ["state"], "delete", None),
            ("vm", "vm-3", ["alias", "nic"], "publish", None),
        ]
    finally:
        await conn.close()


async def test_rollback_leaves_nothing(database: str) -> None:
    conn = await asyncpg.connect(database)
    try:
        tx = conn.transaction()
        await tx.start()
        await outbox.put(conn, "vm", "vm-1", ["nic"], {"uuid": "vm-1"})
        await tx.rollback()
        assert await rows(conn) == []
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("SELECT changefeed.put('vm', '', ARRAY['nic'], '{}')", "id must be a non-empty string"),
        ("SELECT changefeed.put('vm', NULL, ARRAY['nic'], '{}')", "id must be a non-empty"),
        (f"SELECT changefeed.delete('vm', repeat('x', {MAX_ID_BYTES + 1}), ARRAY['nic'])",
         f"id longer than {MAX_ID_BYTES} bytes"),
        ("SELECT changefeed.publish('vm', 'a', ARRAY[]::text[])", "at least one sub-resource"),
        ("SELECT changefeed.publish('', 'a', ARRAY['nic'])", "resource must be a non-empty"),
        ("SELECT changefeed.put('vm', 'a', ARRAY['nic'], '[1]')",
         "^changefeed.put: vm 'a': a put's state must be a JSON object, got array$"),
        ("SELECT changefeed.put('vm', 'a', ARRAY['nic'], NULL)",
         r"^changefeed.put: vm 'a': a put's state must be a JSON object, got null \(a change "
         r"without a state is a publish\)$"),
        ("SELECT changefeed.put('vm', 'a', ARRAY['nic'], 'null')", "got null \\(a change"),
        ("SELECT changefeed.put('vm', 'a', ARRAY['nic'], '\"s\"')", "got string$"),
    ],
)
async def test_refusals_fail_the_transaction_at_the_call(
    database: str, call: str, message: str
) -> None:
    conn = await asyncpg.connect(database)
    try:
        with pytest.raises(asyncpg.InvalidParameterValueError, match=message):
            async with conn.transaction():
                await conn.execute("INSERT INTO vms VALUES ('a', '{}')")
                await conn.fetchval(call)
        assert await rows(conn) == []
        assert await conn.fetchval("SELECT count(*) FROM vms") == 0  # the whole tx failed
    finally:
        await conn.close()


async def test_an_id_of_exactly_the_limit_is_taken(database: str) -> None:
    conn = await asyncpg.connect(database)
    try:
        id = "é" * (MAX_ID_BYTES // 2)  # two bytes each: exactly MAX_ID_BYTES bytes
        await outbox.publish(conn, "vm", id, ["nic"])
        with pytest.raises(asyncpg.InvalidParameterValueError, match="longer than"):
            await outbox.publish(conn, "vm", id + "x", ["nic"])
    finally:
        await conn.close()


async def test_psycopg_connections_call_the_same_functions(database: str) -> None:
    async with await psycopg.AsyncConnection.connect(database) as conn:
        async with conn.transaction():
            row = await outbox.put(conn, "vm", "vm-9", ["nic"], {"uuid": "vm-9", "n": 1})
            await outbox.publish(conn, "vm", "vm-9", ["alias"])
        async with conn.transaction():  # a refusal is psycopg's error, at the call
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="non-empty"):
                await outbox.delete(conn, "vm", "", ["nic"])
    check = await asyncpg.connect(database)
    try:
        assert (await rows(check))[0] == ("vm", "vm-9", ["nic"], "put", '{"n": 1, "uuid": "vm-9"}')
        assert await check.fetchval("SELECT min(id) FROM changefeed.outbox") == row
    finally:
        await check.close()
