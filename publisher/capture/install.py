"""`changefeed capture install`: the checks a DBA reads (each wrong setting named with the
statement that fixes it), and the publication of the mapped tables.

Blocking code on a psycopg2 connection (the command line's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from publisher.capture.database import query, translate_postgres_errors
from publisher.config.capture import Capture


@dataclass(frozen=True, slots=True)
class Finding:
    """A setting that stops the capture: what it is, what it should be, and the fix."""

    setting: str
    found: str
    expected: str
    fix: str

    def __str__(self) -> str:
        return f"{self.setting} is {self.found}, expected {self.expected}: {self.fix}"


def _setting(conn: Any, name: str) -> str:
    return str(query(conn, "SELECT current_setting(%s)", name)[0][0])


def check(conn: Any, capture: Capture) -> list[Finding]:
    """What is wrong for `capture` on the server of `conn` ([] when nothing is)."""
    with translate_postgres_errors("capture checks"):
        return _server(conn, capture) + _tables(conn, capture)


def _server(conn: Any, capture: Capture) -> list[Finding]:
    out = []
    restart = "; then restart PostgreSQL"
    wal_level = _setting(conn, "wal_level")
    if wal_level != "logical":
        out.append(Finding("wal_level", wal_level, "logical",
                           "ALTER SYSTEM SET wal_level = logical" + restart))
    role, may = query(conn, "SELECT current_user, rolreplication OR rolsuper FROM pg_roles "
                      "WHERE rolname = current_user")[0]
    if not may:
        out.append(Finding(f"role {role}", "without REPLICATION", "REPLICATION",
                           f'ALTER ROLE "{role}" WITH REPLICATION'))
    (ours,) = query(conn, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                    capture.slot)[0]
    (slots,) = query(conn, "SELECT count(*) FROM pg_replication_slots")[0]
    most = int(_setting(conn, "max_replication_slots"))
    if slots - ours + 1 > most:
        out.append(Finding("max_replication_slots", str(most), f"at least {slots - ours + 1} "
                           f"({slots - ours} used by others, 1 for slot {capture.slot})",
                           f"ALTER SYSTEM SET max_replication_slots = {slots - ours + 1}"
                           + restart))
    (senders,) = query(conn, "SELECT count(*) FROM pg_stat_replication")[0]
    most = int(_setting(conn, "max_wal_senders"))
    if senders + 1 > most:
        out.append(Finding("max_wal_senders", str(most), f"at least {senders + 1} ({senders} in "
                           "use, 1 for the capture)",
                           f"ALTER SYSTEM SET max_wal_senders = {senders + 1}" + restart))
    return out


def _tables(conn: Any, capture: Capture) -> list[Finding]:
    out = []
    for table in capture.tables:
        (found,) = query(conn, "SELECT to_regclass(%s) IS NOT NULL", table.quoted)[0]
        if not found:
            out.append(Finding(f"table {table.qualified}", "missing", "a table",
                               f"CREATE TABLE {table.quoted} (...) or mend config.js"))
            continue
        columns = {name for (name,) in query(
            conn, "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attnum > 0 AND NOT attisdropped", table.quoted)}
        for column in sorted(table.mapped_columns - columns):
            out.append(Finding(f"column {table.qualified}.{column}", "missing",
                               "a column the mapping reads", "mend config.js or the table"))
        keys = {name for (name,) in query(conn, """
            SELECT a.attname FROM pg_index i JOIN pg_attribute a
                ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
            WHERE i.indrelid = %s::regclass AND i.indisprimary""", table.quoted)}
        if table.id in columns and table.id not in keys:
            out.append(Finding(f"table {table.qualified}", f"keyed by {sorted(keys) or 'nothing'}",
                               f"its primary key on {table.id} (a delete names only the key)",
                               f"ALTER TABLE {table.quoted} ADD PRIMARY KEY ({table.id})"))
    return out


def install(conn: Any, capture: Capture) -> str:
    """Create (or set) the publication of the mapped tables only; the statement run."""
    tables = ", ".join(sorted({table.quoted for table in capture.tables}))
    with translate_postgres_errors("capture install"):
        (exists,) = query(conn, "SELECT count(*) FROM pg_publication WHERE pubname = %s",
                          capture.publication)[0]
        statement = (f'ALTER PUBLICATION "{capture.publication}" SET TABLE {tables}' if exists
                     else f'CREATE PUBLICATION "{capture.publication}" FOR TABLE {tables}')
        query(conn, statement)
    return statement
