"""Re-seeding the bucket's store from PostgreSQL, the authoritative store: each resource's
snapshot query (config.js `outbox.resources.<name>.snapshot`, rows of (id, state)) is read in
one REPEATABLE READ snapshot and committed as puts; ids the store holds that the snapshot has
not are deleted. Through the log, so a listener that bootstraps meanwhile still ends consistent.

The relay runs it between two rounds, so the rows committed after the snapshot are relayed
after it, and each id ends at its newest state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import structlog

from changefeed.protocol import Resource
from publisher.bucket import BATCH, Change, ChangeBucket
from publisher.config.outbox import Outbox
from publisher.outbox import schema
from publisher.outbox.database import translate_postgres_errors
from publisher.outbox.status import read_status

log = structlog.get_logger(__name__)

PREFETCH = 1000
"""Snapshot rows fetched per round trip."""


async def reseed(
    conn: Any, bucket: ChangeBucket, config: Outbox, resources: Mapping[str, Resource],
    only: set[str] | None, *, renew: bool,
) -> str | None:
    """Re-seed the store of each resource (of `only`, when given) that has a snapshot query;
    with `renew`, start a new bucket epoch after it (every listener gets a Resync: what a
    re-seed by hand needs; a bucket that lost its state has a new epoch already). Returns the
    bucket's epoch after it."""
    snapshots = config.snapshot
    for name, resource in resources.items():
        if only is not None and name not in only:
            continue
        query = snapshots.get(name)
        if query is None:
            log.error("outbox: no snapshot query for this resource: its store is not re-seeded",
                      resource=name, key=f"outbox.resources.{name}.snapshot")
            continue
        put, deleted = await seed_resource(conn, bucket, resource, query)
        log.info("outbox: store re-seeded", resource=name, put=put, deleted=deleted)
    epoch = await bucket.log.current_epoch()
    if renew and epoch is not None:
        epoch = await bucket.log.renew_epoch(epoch) or None
    return epoch


async def seed_resource(
    conn: Any, bucket: ChangeBucket, resource: Resource, query: str
) -> tuple[int, int]:
    """Put every (id, state) row of `query` into `resource`'s store and delete the stored ids it
    has not; returns (puts, deletes)."""
    name, subs = resource.resource, resource.sub_resources
    seen: set[str] = set()
    changes: list[Change] = []
    puts = 0
    async with (
        translate_postgres_errors(f"outbox.resources.{name}.snapshot"),
        conn.transaction(isolation="repeatable_read", readonly=True),
    ):
        async for record in conn.cursor(query, prefetch=PREFETCH):
            id, state = str(record[0]), record[1]
            if isinstance(state, str | bytes):
                state = orjson.loads(state)
            if not isinstance(state, dict):
                log.error("outbox: snapshot row skipped: its state is not a JSON object",
                          resource=name, id=id)
                continue
            seen.add(id)
            changes.append(Change.put(name, id, subs, state))
            if len(changes) >= BATCH:
                puts += len(await bucket.commit_many(changes))
                changes = []
    if changes:
        puts += len(await bucket.commit_many(changes))
    stale: list[Change] = []
    after: str | None = None
    while True:
        page = await bucket.page(name, after, BATCH)
        stale += [Change.delete(name, id, subs) for id in page.ids if id not in seen]
        if len(page.ids) < BATCH:
            break
        after = page.ids[-1]
    for start in range(0, len(stale), BATCH):
        await bucket.commit_many(stale[start : start + BATCH])
    return puts, len(stale)


async def resync(
    conn: Any, bucket: ChangeBucket, config: Outbox, resources: Mapping[str, Resource],
    resource: str | None,
) -> str | None:
    """`changefeed outbox resync`: re-seed the store (of `resource`, else of every one) and give
    every listener one Resync. When a publisher relays, it is asked to (a notification: it
    re-seeds before its next rows) and its session's name is returned; else the re-seed runs
    here, holding the relay lock meanwhile so that no relay starts under it (None)."""
    async with translate_postgres_errors("outbox resync"):
        ours = await conn.fetchval(
            "SELECT pg_try_advisory_lock($1, $2)", schema.LOCK_CLASS, schema.RELAY_LOCK
        )
        if not ours:
            status = await read_status(conn)
            payload = schema.RESYNC + (f":{resource}" if resource else "")
            await conn.execute("SELECT pg_notify($1, $2)", schema.CHANNEL, payload)
            return status.relaying or "the relaying publisher"
    try:
        await reseed(conn, bucket, config, resources, {resource} if resource else None, renew=True)
    finally:
        async with translate_postgres_errors("outbox resync"):
            await conn.execute(
                "SELECT pg_advisory_unlock($1, $2)", schema.LOCK_CLASS, schema.RELAY_LOCK
            )
    return None
