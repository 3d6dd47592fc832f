"""The outbox's status: backlog, the oldest row's age, the relaying session, the dead rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from publisher.outbox import schema

STATUS = f"""
SELECT (SELECT count(*) FROM changefeed.outbox),
       (SELECT extract(epoch FROM clock_timestamp() - min(created))::float8
          FROM changefeed.outbox),
       (SELECT count(*) FROM changefeed.outbox_dead),
       (SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid)
         WHERE l.locktype = 'advisory' AND l.granted AND l.classid = {schema.LOCK_CLASS}
           AND l.objid = {schema.RELAY_LOCK} AND l.objsubid = 2 LIMIT 1),
       (SELECT version FROM changefeed.outbox_schema)
"""


@dataclass(frozen=True, slots=True)
class Status:
    backlog: int
    """Rows waiting to be relayed."""
    oldest_age: float | None
    """Seconds since the oldest waiting row was written (None: none waits)."""
    dead: int
    """Rows in changefeed.outbox_dead."""
    relaying: str | None
    """The application_name of the relaying session (`changefeed-relay <publisher>`), if any."""
    version: int | None

    def report(self) -> dict[str, Any]:
        return {
            "backlog": self.backlog, "oldestAgeSeconds": self.oldest_age,
            "deadRows": self.dead, "relayingSession": self.relaying,
            "schemaVersion": self.version,
        }


async def read_status(conn: Any) -> Status:
    """The status, read on asyncpg connection `conn` (the schema must be installed)."""
    backlog, age, dead, relaying, version = await conn.fetchrow(STATUS)
    return Status(int(backlog), age, int(dead), relaying, version)
