"""`changefeed capture status`: the slot as PostgreSQL reports it (active, WAL status, lag in
bytes and seconds, the streaming publisher's session) and, from the bucket, the copy its stream
continues and the rows set aside."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from publisher.capture.database import APPLICATION, query, translate_postgres_errors

SLOT = """
SELECT s.active, coalesce(s.wal_status, ''), s.confirmed_flush_lsn::text,
       (pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint,
       a.application_name, extract(epoch FROM r.flush_lag)::float8
FROM pg_replication_slots s
LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
WHERE s.slot_name = %s
"""


@dataclass(slots=True)
class Status:
    slot: str
    exists: bool = False
    active: bool = False
    wal_status: str = ""
    """reserved, extended, unreserved or lost (invalidated: the capture makes a new slot)."""
    confirmed: str | None = None
    lag_bytes: int | None = None
    lag_seconds: float | None = None
    """pg_stat_replication's flush_lag of the streaming session (None when idle or none)."""
    streaming: str | None = None
    """The streaming publisher (its session's name, `changefeed-capture <publisher id>`)."""
    copied: dict[str, Any] | None = None
    set_aside: list[dict[str, Any]] = field(default_factory=list)

    def held(self, copied: dict[str, Any] | None, set_aside: list[dict[str, Any]]) -> None:
        """The bucket's part: the copy the stream continues, and the rows set aside."""
        self.copied = copied
        self.set_aside = set_aside

    def report(self) -> dict[str, Any]:
        return {
            "slot": self.slot, "exists": self.exists, "active": self.active,
            "walStatus": self.wal_status, "confirmedLsn": self.confirmed,
            "lagBytes": self.lag_bytes, "lagSeconds": self.lag_seconds,
            "streaming": self.streaming, "copied": self.copied, "setAside": self.set_aside,
        }


def read_status(conn: Any, slot: str) -> Status:
    """The slot's status on the server of `conn` (the bucket's part is the caller's)."""
    with translate_postgres_errors("capture status"):
        rows = query(conn, SLOT, slot)
    status = Status(slot)
    if not rows:
        return status
    active, wal_status, confirmed, lag, application, seconds = rows[0]
    status.exists, status.active, status.wal_status = True, bool(active), wal_status
    status.confirmed, status.lag_bytes, status.lag_seconds = confirmed, lag, seconds
    if application and application.startswith(APPLICATION):
        status.streaming = application.removeprefix(APPLICATION).strip() or application
    elif active:
        status.streaming = application or "another client"
    return status
