"""The transactional outbox: the service's PostgreSQL as the authoritative store, its changes
relayed into the bucket exactly once (docs/postgres.md).

    schema.py    the SQL contract (tables, changefeed.put/delete/publish) and `install`
    writer.py    `put`, `delete`, `publish` in the service's transaction, `cursor` after it
    rows.py      outbox rows, claimed in batches, and what becomes of each: a change, or a
                 dead row (pure)
    relay.py     `Relay`: one publisher at a time moves the rows into the bucket
    seed.py      re-seeding the store from the snapshot queries
    status.py    backlog, oldest age, relaying session, dead rows
    database.py  asyncpg connections, and where asyncpg's errors become ours

>>> from publisher import outbox
>>> async with conn.transaction():
...     row = await outbox.put(conn, "vm", vm_uuid, ["nic"], state)
>>> cursor = await outbox.cursor(conn, row, timeout=5)
"""

from changefeed.errors import OutboxError, OutboxRowDead, OutboxWaitTimeout
from publisher.outbox.writer import cursor, delete, publish, put

__all__ = [
    "OutboxError", "OutboxRowDead", "OutboxWaitTimeout", "cursor", "delete", "publish", "put",
]
