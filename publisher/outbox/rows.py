"""Outbox rows as the relay reads them, and what becomes of each: a change for the bucket under
its idempotency key, or a dead row with its reason. Pure: no database, no Redis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from changefeed.errors import ChangeError
from changefeed.protocol import Resource
from changefeed.watch import MAX_ID_BYTES
from publisher.bucket import Change, state_refused

CLAIM = """
UPDATE changefeed.outbox o SET batch = c.first
FROM (SELECT id, min(id) OVER () AS first
      FROM (SELECT id FROM changefeed.outbox WHERE batch IS NULL ORDER BY id LIMIT $1) x) c
WHERE o.id = c.id
RETURNING o.id, o.resource, o.changed_id, o.sub_resources, o.op, o.state::text,
    jsonb_typeof(o.state), o.batch
"""
"""Claim the oldest rows not claimed yet (up to $1) as one batch, named by its first row id:
what the batch is, written down before it is committed, so a relay that dies after the commit
leaves a successor the very same batch to send again under the same key. The relay removes what
it relayed, so reading in id order from the start sees a row whose transaction took a lower id
but committed later (no `id > last seen`)."""
CLAIMED = """
SELECT id, resource, changed_id, sub_resources, op, state::text, jsonb_typeof(state), batch
FROM changefeed.outbox WHERE batch IS NOT NULL ORDER BY batch, id
"""
"""The batches a relay claimed and did not finish (it died): sent again first."""


@dataclass(frozen=True, slots=True)
class Row:
    """One row of changefeed.outbox."""

    id: int
    resource: str
    changed_id: str
    sub_resources: tuple[str, ...]
    op: str
    state: str | None
    """The jsonb state as text (None unless a put)."""
    kind: str | None = "object"
    """What PostgreSQL says the state is (jsonb_typeof: 'object', 'array'...; None: NULL)."""


@dataclass(frozen=True, slots=True)
class Dead:
    """A row that can never be relayed, and why."""

    row: Row
    reason: str


@dataclass(frozen=True, slots=True)
class Batch:
    """Claimed rows, in id order, committed together under the key of their first row id."""

    id: int
    records: list[Sequence[Any]]


def batches(records: Sequence[Sequence[Any]]) -> list[Batch]:
    """Claimed records (CLAIM's or CLAIMED's) grouped into their batches, in order."""
    grouped: dict[int, list[Sequence[Any]]] = {}
    for record in sorted(records, key=lambda r: (r[-1], r[0])):
        grouped.setdefault(int(record[-1]), []).append(record)
    return [Batch(id, rows) for id, rows in grouped.items()]


def key_of(install_id: str, batch_id: int) -> str:
    """The idempotency key batch `batch_id` is committed under: the same at every retry, by any
    relay of this outbox (`install_id` tells outboxes apart when several feed one bucket)."""
    return f"outbox:{install_id}:{batch_id}"


def change_of(row: Row, resources: Mapping[str, Resource]) -> Change | Dead:
    """The change `row` stands for, or why it is dead: a resource or sub-resource config.js does
    not have, an id the bucket refuses, an unknown op, a state that is not a JSON object."""
    resource = resources.get(row.resource)
    if resource is None:
        known = ", ".join(sorted(resources))
        return Dead(row, f"unknown resource {row.resource!r} (known: {known})")
    unknown = [s for s in row.sub_resources if s not in resource.sub_resources]
    if unknown or not row.sub_resources:
        return Dead(row, f"unknown sub-resource(s) {', '.join(map(repr, unknown))} of "
                         f"{row.resource!r} (known: {', '.join(resource.sub_resources)})"
                    if unknown else "no sub-resource")
    if not row.changed_id or len(row.changed_id.encode()) > MAX_ID_BYTES:
        return Dead(row, f"id empty or longer than {MAX_ID_BYTES} bytes")
    if row.op in ("delete", "publish"):
        return Change(row.resource, row.changed_id, row.sub_resources, row.op)  # type: ignore[arg-type]
    if row.op != "put":
        return Dead(row, f"unknown op {row.op!r}")
    if row.kind != "object" or row.state is None:
        return Dead(row, str(state_refused(row.resource, row.changed_id, row.kind or "null")))
    # PostgreSQL's text of the jsonb, committed as it is: no decoding and encoding again.
    state = orjson.Fragment(row.state.encode())
    return Change.put(row.resource, row.changed_id, row.sub_resources, state)


def sort_rows(
    records: Sequence[Sequence[Any]], resources: Mapping[str, Resource]
) -> tuple[list[tuple[Row, Change]], list[Dead]]:
    """The rows of a batch (id order kept) as (row, change) to relay, and the dead ones."""
    relay: list[tuple[Row, Change]] = []
    dead: list[Dead] = []
    for record in records:
        id, resource, changed_id, subs, op, state, kind = record[:7]
        row = Row(int(id), resource, changed_id, tuple(subs or ()), op, state, kind)
        made = change_of(row, resources)
        if isinstance(made, Dead):
            dead.append(made)
        else:
            relay.append((row, made))
    return relay, dead


def refused(error: ChangeError, row: Row) -> Dead:
    """A row the bucket refused (its key first used for other changes: the outbox was restored
    from an older backup and reuses ids), as a dead row."""
    return Dead(row, f"refused by the bucket: {error}")
