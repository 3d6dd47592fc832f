"""What a service calls beside its own writes: `put`, `delete` and `publish` inside its
transaction, and `cursor` after its commit, on its own asyncpg or psycopg 3 (async) connection.

They run the SQL contract's functions (publisher.outbox.schema), so a service that uses another
driver or an ORM calls the same SQL itself. A function's refusal (an empty id, an id over
MAX_ID_BYTES, no sub-resource, a state that is not a JSON object) is the driver's error, raised
at the call: the service's transaction fails there, not later.

>>> async with conn.transaction():
...     await conn.execute("UPDATE vms SET state = $2 WHERE uuid = $1", vm_uuid, state)
...     row = await outbox.put(conn, "vm", vm_uuid, ["state"], state)
>>> cursor = await outbox.cursor(conn, row, timeout=5)   # read-your-writes
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import orjson

from changefeed.errors import OutboxRowDead, OutboxWaitTimeout

_CALLS = {
    "put": "SELECT changefeed.put({0}, {1}, {2}, {3}::jsonb)",
    "delete": "SELECT changefeed.delete({0}, {1}, {2})",
    "publish": "SELECT changefeed.publish({0}, {1}, {2})",
}
_WHERE = """
SELECT (SELECT cursor FROM changefeed.outbox_relayed WHERE id = {0}),
       (SELECT reason FROM changefeed.outbox_dead WHERE id = {0}),
       EXISTS (SELECT 1 FROM changefeed.outbox WHERE id = {0})
"""
WAIT_STEPS = (0.001, 0.002, 0.005, 0.01, 0.02)
"""Seconds between two looks of `cursor` at the outbox: short at first (a relay woken by the
commit's notification takes about a millisecond), then every 20 ms."""


def _is_asyncpg(conn: Any) -> bool:
    return hasattr(conn, "fetchval") and hasattr(conn, "add_listener")


async def _fetchrow(conn: Any, template: str, *args: Any) -> Sequence[Any]:
    """One row of `template` (`{n}` placeholders) on either driver."""
    if _is_asyncpg(conn):
        row = await conn.fetchrow(template.format(*(f"${n + 1}" for n in range(len(args)))), *args)
    else:  # psycopg 3 AsyncConnection
        cur = await conn.execute(template.format(*("%s" for _ in args)), args)
        row = await cur.fetchone()
    assert row is not None
    return tuple(row)


async def _call(conn: Any, op: str, *args: Any) -> int:
    (row_id,) = await _fetchrow(conn, _CALLS[op], *args)
    return int(row_id)


async def put(conn: Any, resource: str, id: str, sub_resources: Sequence[str], state: Any) -> int:
    """Append a change storing `state` (a JSON object) for `id`; returns the outbox row id.

    >>> row = await outbox.put(conn, "vm", vm_uuid, ["nic"], {"uuid": vm_uuid, "nics": []})
    """
    return await _call(conn, "put", resource, id, list(sub_resources), orjson.dumps(state).decode())


async def delete(conn: Any, resource: str, id: str, sub_resources: Sequence[str]) -> int:
    """Append a change removing `id`'s stored state; returns the outbox row id.

    >>> row = await outbox.delete(conn, "vm", vm_uuid, ["state"])
    """
    return await _call(conn, "delete", resource, id, list(sub_resources))


async def publish(conn: Any, resource: str, id: str, sub_resources: Sequence[str]) -> int:
    """Append a change with no state (the store keeps what it had); returns the outbox row id.

    >>> row = await outbox.publish(conn, "vm", vm_uuid, ["alias"])
    """
    return await _call(conn, "publish", resource, id, list(sub_resources))


async def cursor(conn: Any, row_id: int, *, timeout: float = 5.0) -> str:
    """The bucket cursor of outbox row `row_id` once the relay has committed it, for
    read-your-writes (`Listener.wait_for(cursor)`, `--wait-seen-by`). Call it after the
    transaction that made the row committed, outside a transaction.

    Raises OutboxRowDead when the row was moved to changefeed.outbox_dead, OutboxWaitTimeout
    after `timeout` seconds.

    >>> cursor = await outbox.cursor(conn, row, timeout=5)
    """
    deadline = time.monotonic() + timeout
    step = 0
    while True:
        relayed, dead, pending = await _fetchrow(conn, _WHERE, row_id)
        if relayed is not None:
            return str(relayed)
        if dead is not None:
            raise OutboxRowDead(row_id, str(dead))
        left = deadline - time.monotonic()
        if left <= 0:
            raise OutboxWaitTimeout(row_id, bool(pending), timeout)
        await asyncio.sleep(min(left, WAIT_STEPS[min(step, len(WAIT_STEPS) - 1)]))
        step += 1
