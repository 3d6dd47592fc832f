"""The SQL contract: the `changefeed` schema, its tables and the three functions a service calls
inside its own transaction, installed (and later migrated) by `install`.

    changefeed.outbox          rows waiting to be relayed (removed once the bucket has them)
    changefeed.outbox_dead     rows that can never be relayed, with the reason (bounded)
    changefeed.outbox_relayed  relayed rows' cursors, kept `outbox.keepRelayed` seconds
    changefeed.outbox_schema   the installed version and this outbox's identity

    changefeed.put(resource, id, sub_resources, state jsonb) -> bigint
    changefeed.delete(resource, id, sub_resources) -> bigint
    changefeed.publish(resource, id, sub_resources) -> bigint

Each function checks what it can (a non-empty resource, an id of 1 to MAX_ID_BYTES bytes, at
least one sub-resource, a JSON object as state), appends one row and `pg_notify`s the relay's
channel; it takes no lock beyond the row's own insert. docs/postgres.md describes the contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from changefeed.errors import OutboxError
from changefeed.watch import MAX_ID_BYTES

VERSION = 1
"""The schema version this release installs; `install` migrates older ones up to it."""
CHANNEL = "changefeed_outbox"
"""The channel the functions notify and the relay listens on."""
RESYNC = "resync"
"""The payload on CHANNEL that asks the relay to re-seed the store ('resync:<resource>': one)."""
LOCK_CLASS = 0x63666478
"""The first key of the outbox's advisory locks (two-key form, 'cfdx'); the second names the
lock: INSTALL_LOCK serialises installs, RELAY_LOCK is held by the relaying publisher."""
INSTALL_LOCK = 0
RELAY_LOCK = 1

_BOOTSTRAP = """
CREATE SCHEMA IF NOT EXISTS changefeed;
CREATE TABLE IF NOT EXISTS changefeed.outbox_schema (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version integer NOT NULL,
    install_id uuid NOT NULL DEFAULT gen_random_uuid(),
    installed timestamptz NOT NULL DEFAULT now()
);
"""

MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE changefeed.outbox (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource text NOT NULL,
    changed_id text NOT NULL,
    sub_resources text[] NOT NULL,
    op text NOT NULL CHECK (op IN ('put', 'delete', 'publish')),
    state jsonb,
    created timestamptz NOT NULL DEFAULT clock_timestamp(),
    batch bigint
);
COMMENT ON COLUMN changefeed.outbox.batch IS
    'set by the relay before it commits the row: the first row id of its batch, which names the
     batch''s idempotency key in the bucket (NULL: not claimed yet)';
CREATE TABLE changefeed.outbox_dead (
    id bigint PRIMARY KEY,
    resource text,
    changed_id text,
    sub_resources text[],
    op text,
    state jsonb,
    created timestamptz,
    reason text NOT NULL,
    died timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE changefeed.outbox_relayed (
    id bigint PRIMARY KEY,
    cursor text NOT NULL,
    relayed timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_relayed_relayed ON changefeed.outbox_relayed (relayed);
""",
}
"""Version -> the DDL that brings version - 1 to it (each run once, in order, in the install's
transaction). A later release adds entries; it never edits one."""

FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION changefeed.append_change(
    p_op text, p_resource text, p_id text, p_subs text[], p_state jsonb
) RETURNS bigint LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    row_id bigint;
BEGIN
    IF p_resource IS NULL OR p_resource = '' THEN
        RAISE EXCEPTION 'changefeed.%: resource must be a non-empty string', p_op
            USING ERRCODE = '22023';
    END IF;
    IF p_id IS NULL OR p_id = '' THEN
        RAISE EXCEPTION 'changefeed.%: id must be a non-empty string', p_op
            USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_id) > {MAX_ID_BYTES} THEN
        RAISE EXCEPTION 'changefeed.%: id longer than {MAX_ID_BYTES} bytes (% bytes)',
            p_op, octet_length(p_id) USING ERRCODE = '22023';
    END IF;
    IF p_subs IS NULL OR cardinality(p_subs) = 0 OR array_position(p_subs, NULL) IS NOT NULL
            OR '' = ANY (p_subs) THEN
        RAISE EXCEPTION 'changefeed.%: sub_resources must name at least one sub-resource', p_op
            USING ERRCODE = '22023';
    END IF;
    IF p_op = 'put' AND (p_state IS NULL OR jsonb_typeof(p_state) <> 'object') THEN
        -- The message of publisher.bucket.state_refused, spelt out again.
        RAISE EXCEPTION 'changefeed.put: % %: a put''s state must be a JSON object, got %',
            p_resource, quote_literal(p_id), coalesce(jsonb_typeof(p_state), 'null')
                || CASE WHEN coalesce(jsonb_typeof(p_state), 'null') = 'null'
                    THEN ' (a change without a state is a publish)' ELSE '' END
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO changefeed.outbox (resource, changed_id, sub_resources, op, state)
        VALUES (p_resource, p_id, p_subs, p_op, p_state) RETURNING id INTO row_id;
    PERFORM pg_notify('{CHANNEL}', '');
    RETURN row_id;
END
$fn$;

CREATE OR REPLACE FUNCTION changefeed.put(
    resource text, id text, sub_resources text[], state jsonb
) RETURNS bigint LANGUAGE sql VOLATILE AS
$fn$ SELECT changefeed.append_change('put', $1, $2, $3, $4) $fn$;

CREATE OR REPLACE FUNCTION changefeed.delete(
    resource text, id text, sub_resources text[]
) RETURNS bigint LANGUAGE sql VOLATILE AS
$fn$ SELECT changefeed.append_change('delete', $1, $2, $3, NULL) $fn$;

CREATE OR REPLACE FUNCTION changefeed.publish(
    resource text, id text, sub_resources text[]
) RETURNS bigint LANGUAGE sql VOLATILE AS
$fn$ SELECT changefeed.append_change('publish', $1, $2, $3, NULL) $fn$;
"""
"""The functions, replaced by every install (CREATE OR REPLACE), so a release's install brings
its own."""


@dataclass(frozen=True, slots=True)
class Installed:
    """What `install` found and left: the version before (0: none) and after."""

    before: int
    after: int


async def install(conn: Any) -> Installed:
    """Create or migrate the outbox schema on asyncpg connection `conn`, in one transaction
    (concurrent installs wait for each other). Idempotent. Raises OutboxError when the database
    has a newer version than this release knows (nothing changed)."""
    async with conn.transaction():
        await conn.execute(f"SELECT pg_advisory_xact_lock({LOCK_CLASS}, {INSTALL_LOCK})")
        await conn.execute(_BOOTSTRAP)
        before = await conn.fetchval("SELECT version FROM changefeed.outbox_schema") or 0
        if before > VERSION:
            raise OutboxError(
                f"the outbox schema is at version {before}, newer than this release's "
                f"{VERSION}: install with the newer release"
            )
        for version in range(before + 1, VERSION + 1):
            await conn.execute(MIGRATIONS[version])
        await conn.execute(FUNCTIONS)
        await conn.execute(
            "INSERT INTO changefeed.outbox_schema (version) VALUES ($1) "
            "ON CONFLICT (singleton) DO UPDATE SET version = EXCLUDED.version",
            VERSION,
        )
    return Installed(before, VERSION)
