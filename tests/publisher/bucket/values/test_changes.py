"""The bucket's pure parts: values, the content digest, markers, the key layout and the scripts
as package data. No Redis."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files

import orjson
import pytest

from changefeed.cursor import Position, StreamId
from changefeed.errors import ChangeError
from publisher.bucket import (
    COMMIT_LUA,
    Change,
    Committed,
    Keys,
    decode_marker,
    digest_of,
    encode_marker,
    object_state,
    state_refused,
)
from publisher.bucket.lua import scripts
from publisher.bucket.values.changes import encode_change, pack_change_values, pack_changes


@dataclass
class Vm:
    uuid: str


def test_a_put_takes_only_a_json_object_as_state() -> None:
    for state, given in [([1, 2], "array"), ("str", "string"), (3, "number"), (1.5, "number"),
                         (True, "boolean"), (None, "null"), (orjson.Fragment(b"[1]"), "array")]:
        with pytest.raises(ChangeError) as refused:
            Change.put("vm", "x1", ["nic"], state)
        assert str(refused.value) == str(state_refused("vm", "x1", given))
        assert str(refused.value).startswith(f"vm 'x1': a put's state must be a JSON object, "
                                             f"got {given}")
    assert str(state_refused("vm", "x1", "null")).endswith(
        "got null (a change without a state is a publish)")
    for state in [{}, {"a": [1]}, Vm("x1"), orjson.Fragment(b' {"a": 1}')]:
        Change.put("vm", "x1", ["nic"], state)  # what orjson encodes as an object
    Change.publish("vm", "x1", ["nic"])
    Change.delete("vm", "x1", ["nic"])


def test_an_encoded_state_is_checked_alike() -> None:
    assert object_state("vm", "a", b'{"x": 1}') == b'{"x": 1}'
    assert object_state("vm", "a", b'\n {}') == b'\n {}'
    for encoded, given in [(b"[]", "array"), (b'"s"', "string"), (b"-1", "number"),
                           (b"false", "boolean"), (b"null", "null"), (b"", "nothing")]:
        with pytest.raises(ChangeError, match=f"^vm 'a': a put's state must be a JSON object, "
                                              f"got {given}"):
            object_state("vm", "a", encoded)


def test_digest_names_the_changes_in_order() -> None:
    a = Change.put("vm", "a", ["nic"], {"n": 1})
    b = Change.delete("vm", "b", ["nic"])
    assert digest_of([a, b]) == digest_of([Change.put("vm", "a", ("nic",), {"n": 1}), b])
    assert digest_of([a, b]) != digest_of([b, a])
    assert digest_of([a]) != digest_of([Change.put("vm", "a", ["nic"], {"n": 2})])
    assert digest_of([a]) != digest_of([Change.publish("vm", "a", ["nic"])])
    # A delete's state is not stored, so it is not part of what the key names.
    assert digest_of([Change("vm", "b", ("nic",), "delete", {"x": 1})]) == digest_of([b])


def test_packing_changes_in_one_pass_gives_the_bytes_of_encoding_then_packing() -> None:
    changes = [
        Change.put("vm", "a", ("nic",), {"n": 1, "s": "é"}), Change.delete("vm", "b", ["nic", "x"]),
        Change.publish("net", "c", ("q",)), Change("vm", "d", ("nic",), "delete", {"x": 1}),
        Change.put("net", "ü", ["a"], {"y": [1, 2]}), Change.put("vm", "e", ["nic"], {}),
        Change.put("vm", "big", ("nic",), {"y": "z" * 5000}),  # a header not looked up
    ]
    one_pass = pack_change_values(changes)
    assert one_pass == pack_changes([encode_change(c) for c in changes])
    assert one_pass.resources == ["vm", "net"]
    assert pack_change_values([]) == pack_changes([])
    with pytest.raises(TypeError):  # what orjson cannot encode fails the packing
        pack_change_values([Change.put("vm", "f", ("nic",), {"x": object()})])


def test_committed_gives_the_run_of_cursors() -> None:
    done = Committed("abcdefgh", 1_700_000_000_000, 4, 3, fresh=False)
    assert done.cursors == [
        Position.single("abcdefgh", StreamId(1_700_000_000_000, seq)).encode() for seq in (4, 5, 6)
    ]
    assert (done.first_cursor, done.last_cursor) == (done.cursors[0], done.cursors[-1])
    assert Committed("abcdefgh", 1, 0, 0).first_cursor is None


@pytest.mark.parametrize("id", ["a", "vm/1 2", "é" * 200])
def test_markers_round_trip(id: str) -> None:
    assert decode_marker(encode_marker(id)) == id


@pytest.mark.parametrize("marker", ["", "%%%", "A", encode_marker("x" * 513)])
def test_foreign_markers_are_refused(marker: str) -> None:
    with pytest.raises(ValueError, match="not a marker"):
        decode_marker(marker)


def test_key_layout() -> None:
    keys = Keys("cf")
    assert keys.common == ["{cf}:log", "{cf}:epoch", "{cf}:partitions", "{cf}:last", "{cf}:trimmed"]
    assert keys.idempotency_pair == ["{cf}:idem", "{cf}:idem:at"]
    assert keys.stream(3, 4) == "{cf}:log:3" and keys.stream(0, 1) == "{cf}:log"
    assert keys.ledger("q") == "{cf}:spark:q"


def test_scripts_are_package_data_after_the_shared_library() -> None:
    package = files("publisher.bucket.lua")
    library = package.joinpath("lib.lua").read_text()
    loaded = [getattr(scripts, name) for name in scripts.__all__ if name.isupper()]
    for script in loaded:
        own = package.joinpath(f"{script.name}.lua").read_text()
        assert script.text == library + own
    assert scripts.COMMIT.text == COMMIT_LUA
    files_there = {p.name for p in package.iterdir() if p.name.endswith(".lua")}
    assert files_there == {"lib.lua"} | {f"{script.name}.lua" for script in loaded}, (
        "every .lua file is a script the client loads"
    )


def test_the_names_the_tree_imports_from_the_bucket_stay_exported() -> None:
    import publisher.bucket as bucket

    documented = {
        "BATCH", "COMMIT_LUA", "Change", "ChangeBucket", "Committed", "Keys", "LogEntry", "Op",
        "StatePage", "Piece", "Retention", "connect", "decode_marker", "digest_of", "encode_marker",
        "merge_partitions", "parse_entry", "partition_of", "translate_redis_errors",
    }
    assert documented <= set(bucket.__all__)
    for name in bucket.__all__:
        assert hasattr(bucket, name)
