"""What becomes of an outbox row (publisher.outbox.rows): pure, no database."""

from __future__ import annotations

import orjson

from changefeed.protocol import Resource
from publisher.bucket import Change
from publisher.outbox.rows import Dead, Row, batches, change_of, key_of, sort_rows

RESOURCES = {"vm": Resource("vm", ("nic", "state"), "/vms")}


def row(op: str = "put", resource: str = "vm", subs: tuple[str, ...] = ("nic",),
        state: str | None = '{"a": 1}', id: str = "vm-1", row_id: int = 7,
        kind: str | None = "object") -> Row:
    return Row(row_id, resource, id, subs, op, state, kind)


def test_rows_become_changes() -> None:
    put = change_of(row(), RESOURCES)
    assert isinstance(put, Change) and put.op == "put"
    assert orjson.dumps(put.state) == b'{"a": 1}'  # PostgreSQL's text, passed through
    assert change_of(row("delete", state=None), RESOURCES) == Change.delete("vm", "vm-1", ["nic"])
    assert change_of(row("publish", subs=("nic", "state"), state=None), RESOURCES) == (
        Change.publish("vm", "vm-1", ["nic", "state"])
    )


def test_bad_rows_are_dead_with_their_reason() -> None:
    cases = {
        "unknown resource 'disk'": row(resource="disk"),
        "unknown sub-resource(s) 'alias'": row(subs=("nic", "alias")),
        "no sub-resource": row(subs=()),
        "vm 'vm-1': a put's state must be a JSON object, got array": row(state="[1, 2]",
                                                                        kind="array"),
        "vm 'vm-1': a put's state must be a JSON object, got null (a change without a state "
        "is a publish)": row(state=None, kind=None),
        "vm 'vm-1': a put's state must be a JSON object, got number": row(state="3",
                                                                         kind="number"),
        "id empty": row(id=""),
        "longer than 512 bytes": row(id="x" * 513),
        "unknown op 'upsert'": row(op="upsert"),
    }
    for reason, bad in cases.items():
        made = change_of(bad, RESOURCES)
        assert isinstance(made, Dead), reason
        assert reason in made.reason


def test_keys_name_the_row_and_the_outbox() -> None:
    assert key_of("abc", 7) == "outbox:abc:7"
    assert key_of("abc", 7) != key_of("abd", 7)


def test_sort_keeps_id_order_and_sets_dead_rows_aside() -> None:
    records = [
        (1, "vm", "a", ["nic"], "put", '{"x": 1}', "object", 1),
        (2, "disk", "b", ["nic"], "publish", None, None, 1),
        (3, "vm", "c", ["state"], "delete", None, None, 1),
    ]
    relay, dead = sort_rows(records, RESOURCES)
    assert [r.id for r, _ in relay] == [1, 3]
    assert [d.row.id for d in dead] == [2]


def test_claimed_records_group_into_their_batches_in_order() -> None:
    records = [(9, "vm", "x", ["nic"], "publish", None, None, 7),
               (4, "vm", "y", ["nic"], "publish", None, None, 4),
               (7, "vm", "z", ["nic"], "publish", None, None, 7)]
    found = batches(records)
    assert [(b.id, [r[0] for r in b.records]) for b in found] == [(4, [4]), (7, [7, 9])]
