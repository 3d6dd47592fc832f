"""publisher.capture.rows and .assemble: what each row change becomes (pure)."""

from __future__ import annotations

import pytest

from publisher.bucket import Change
from publisher.capture import pgoutput as po
from publisher.capture.assemble import Assembler, ProtocolViolation
from publisher.capture.rows import RowChange, converter, plan
from publisher.config.capture import Capture, Table

VMS = Table("public", "vms", "vm", "uuid", (("nic", ("nics",)), ("alias", ("alias",))))
MORAY = Table("public", "vmapi_vms", "vm", "_key", (("state", ("state",)),), moray=True)
EVERY = {"vm": ("nic", "alias", "state")}
CAPTURE = Capture("s", "p", (VMS, MORAY), postgres="postgresql://x")
INT4, TEXT, JSONB = 23, 25, 3802


def test_values_by_type() -> None:
    """Integers, floats and booleans as such, json and jsonb parsed, every other type (numeric,
    timestamps, arrays, enums...) as its text."""
    values = [(INT4, b"7"), (701, b"1.5"), (701, b"NaN"), (16, b"t"), (16, b"f"),
              (JSONB, b'{"a": [1]}'), (1700, b"1.10"), (TEXT, b"x")]
    assert [converter(oid)(data) for oid, data in values] == [
        7, 1.5, "NaN", True, False, {"a": [1]}, "1.10", "x"]


def test_inserts_updates_and_deletes_announce_against_the_stored_state() -> None:
    stored = {("vm", "a"): {"uuid": "a", "nics": [], "alias": "x", "big": "B"}}
    rows = [
        RowChange(VMS, "a", {"uuid": "a", "nics": [], "alias": "y", "big": po.UNCHANGED}),
        RowChange(VMS, "a", {"uuid": "a", "nics": [1], "alias": "y", "big": po.UNCHANGED}),
        RowChange(VMS, "a", {"uuid": "a", "nics": [1], "alias": "y", "big": "C"}),
        RowChange(VMS, "a", {"uuid": "a", "nics": [1], "alias": "y", "big": "C"}),
        RowChange(VMS, "b", {"uuid": "b", "nics": None, "alias": None, "big": None}, insert=True),
        RowChange(VMS, "c", {"uuid": "c", "nics": None, "alias": None, "big": None}, "b"),
        RowChange(VMS, "c", None),
    ]
    planned = plan(rows, stored, EVERY)
    every = EVERY["vm"]
    state = {"uuid": "a", "nics": [1], "alias": "y", "big": "C"}
    assert planned.changes == [
        Change.put("vm", "a", ["alias"], {"uuid": "a", "nics": [], "alias": "y", "big": "B"}),
        Change.put("vm", "a", ["nic"], {"uuid": "a", "nics": [1], "alias": "y", "big": "B"}),
        Change.put("vm", "a", every, state),  # only an unmapped column changed
        Change.put("vm", "b", every, {"uuid": "b", "nics": None, "alias": None, "big": None}),
        Change.delete("vm", "b", every),  # the id changed: a delete and an insert
        Change.put("vm", "c", every, {"uuid": "c", "nics": None, "alias": None, "big": None}),
        Change.delete("vm", "c", every),
    ]
    assert planned.set_aside == []


def test_an_unchanged_toast_value_without_a_stored_state_is_set_aside() -> None:
    planned = plan([RowChange(VMS, "z", {"uuid": "z", "big": po.UNCHANGED})], {}, EVERY, 9)
    assert planned.changes == []
    assert [(s.id, s.reason, s.lsn) for s in planned.set_aside] == [
        ("z", "column big is an unchanged TOASTed value and the bucket holds no state to take "
              "it from", 9)]


def test_moray_states_come_from_value() -> None:
    stored = {("vm", "m"): {"state": "running", "n": 1}}
    rows = [
        RowChange(MORAY, "m", {"_key": "m", "_value": '{"state": "running", "n": 1}',
                               "_etag": "B"}),
        RowChange(MORAY, "m", {"_key": "m", "_value": '{"state": "stopped", "n": 1}',
                               "_etag": "C"}),
        RowChange(MORAY, "m", {"_key": "m", "_value": po.UNCHANGED, "_etag": "D"}),
        RowChange(MORAY, "q", {"_key": "q", "_value": "[1]"}, insert=True),
        RowChange(MORAY, "r", {"_key": "r", "_value": "{"}, insert=True),
    ]
    planned = plan(rows, stored, EVERY)
    assert planned.changes == [Change.put("vm", "m", ["state"], {"state": "stopped", "n": 1})]
    assert [(s.id, s.reason.split(" (")[0]) for s in planned.set_aside] == [
        ("q", "_value is not a JSON object"), ("r", "_value is not JSON")]


def relation(*columns: tuple[str, int, int], oid: int = 1) -> po.Relation:
    return po.Relation(oid, "public", "vms", ord("d"),
                       tuple(po.Column(key, name, type_oid, -1) for name, type_oid, key in columns))


def test_the_assembler_checks_each_relation_against_its_mapping() -> None:
    assembler = Assembler(CAPTURE)
    assembler.feed(relation(("uuid", TEXT, 1), ("nics", JSONB, 0), ("alias", TEXT, 0)))
    assembler.feed(po.Begin(100, 0, 1))
    assembler.feed(po.Insert(1, (po.Value.text("a"), po.NULL, po.Value.text("x"))))
    assembler.feed(relation(("uuid", TEXT, 1), ("nics", JSONB, 0)))  # alias dropped
    assembler.feed(po.Update(1, None, (po.Value.text("a"), po.NULL)))
    txn = assembler.feed(po.Commit(0, 100, 108, 0))
    assert txn is not None and (txn.lsn, txn.end_lsn) == (100, 108)
    assert [r.new for r in txn.rows] == [{"uuid": "a", "nics": None, "alias": "x"}]
    gone = "column alias of public.vms is gone (dropped or renamed): the mapping needs it"
    assert [(s.id, s.reason) for s in txn.set_aside] == [("a", gone)]
    assert assembler.reports == [gone]
    assembler.feed(relation(("uuid", TEXT, 1), ("nics", TEXT, 0), ("alias", TEXT, 0)))
    assert assembler.reports[-1] == "column nics of public.vms changed type from jsonb to text"
    with pytest.raises(ProtocolViolation):
        assembler.feed(po.Insert(1, ()))


def test_an_id_outside_the_key_is_a_problem() -> None:
    assembler = Assembler(CAPTURE)
    assembler.feed(relation(("uuid", TEXT, 0), ("nics", JSONB, 1), ("alias", TEXT, 0)))
    assert assembler.reports == ["column uuid of public.vms is not in its replica identity (its "
                                 "primary key): a delete could not name the id"]
