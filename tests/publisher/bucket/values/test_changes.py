"""The bucket's pure parts: values, the content digest, markers, the key layout and the scripts
as package data. No Redis."""

from __future__ import annotations

from importlib.resources import files

import pytest

from changefeed.cursor import Cursor, StreamId
from publisher.bucket import (
    COMMIT_LUA,
    Change,
    Committed,
    Keys,
    decode_marker,
    digest_of,
    encode_marker,
)
from publisher.bucket.lua import scripts


def test_digest_names_the_changes_in_order() -> None:
    a = Change.put("vm", "a", ["nic"], {"n": 1})
    b = Change.delete("vm", "b", ["nic"])
    assert digest_of([a, b]) == digest_of([Change.put("vm", "a", ("nic",), {"n": 1}), b])
    assert digest_of([a, b]) != digest_of([b, a])
    assert digest_of([a]) != digest_of([Change.put("vm", "a", ["nic"], {"n": 2})])
    assert digest_of([a]) != digest_of([Change.publish("vm", "a", ["nic"])])
    # A delete's state is not stored, so it is not part of what the key names.
    assert digest_of([Change("vm", "b", ("nic",), "delete", {"x": 1})]) == digest_of([b])


def test_committed_gives_the_run_of_cursors() -> None:
    done = Committed("abcdefgh", 1_700_000_000_000, 4, 3, fresh=False)
    assert done.cursors == [
        Cursor("abcdefgh", StreamId(1_700_000_000_000, seq)).encode() for seq in (4, 5, 6)
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
