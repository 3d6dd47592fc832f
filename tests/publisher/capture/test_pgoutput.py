"""publisher.capture.pgoutput: every message kind decoded from a real server's bytes, and an
encode/decode round trip of generated messages."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from publisher.capture import pgoutput as po
from tests.publisher.capture.rig import sql

names = st.text(st.characters(blacklist_characters="\0", blacklist_categories=["Cs"]),
                max_size=20)
lsns = st.integers(0, 2**64 - 1)
times = st.integers(-(2**63), 2**63 - 1)
oids = st.integers(0, 2**32 - 1)
values = st.one_of(
    st.just(po.NULL), st.just(po.UNCHANGED),
    st.builds(po.Value, st.just("t"), st.binary(max_size=50)),
    st.builds(po.Value, st.just("b"), st.binary(max_size=50)),
)
tuples = st.lists(values, max_size=8).map(tuple)
columns = st.builds(po.Column, st.integers(0, 1), names, oids, st.integers(-1, 2**31 - 1))
messages = st.one_of(
    st.builds(po.Begin, lsns, times, oids),
    st.builds(po.Commit, st.just(0), lsns, lsns, times),
    st.builds(po.Origin, lsns, names),
    st.builds(po.Relation, oids, names, names, st.sampled_from(b"dnfi"),
              st.lists(columns, max_size=6).map(tuple)),
    st.builds(po.Type, oids, names, names),
    st.builds(po.Insert, oids, tuples),
    st.builds(po.Update, oids, st.none(), tuples),
    st.builds(lambda o, old, kind, new: po.Update(o, old, new, kind), oids, tuples,
              st.sampled_from(["K", "O"]), tuples),
    st.builds(po.Delete, oids, tuples, st.sampled_from(["K", "O"])),
    st.builds(po.Truncate, st.integers(0, 3), st.lists(oids, max_size=5).map(tuple)),
    st.builds(po.Message, st.booleans(), lsns, names, st.binary(max_size=40)),
)


@given(messages)
def test_encode_then_decode_gives_the_message_back(message: po.Decoded) -> None:
    assert po.decode(po.encode(message)) == message


@given(messages, st.data())
def test_a_cut_message_is_a_decode_error(message: po.Decoded, data: st.DataObject) -> None:
    payload = po.encode(message)
    cut = data.draw(st.integers(0, len(payload) - 1))
    with pytest.raises(po.DecodeError):
        po.decode(payload[:cut])


def test_bytes_after_a_message_or_an_unknown_kind_are_errors() -> None:
    with pytest.raises(po.DecodeError, match="1 bytes after the end of a Begin"):
        po.decode(po.encode(po.Begin(1, 2, 3)) + b"x")
    with pytest.raises(po.DecodeError, match="unknown message kind 'Z'"):
        po.decode(b"Z")
    with pytest.raises(po.DecodeError, match="unknown tuple value kind 'q'"):
        po.decode(b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">h", 1) + b"q")


@given(lsns)
def test_lsn_text_round_trip(lsn: int) -> None:
    assert po.parse_lsn(po.format_lsn(lsn)) == lsn


def peek(url: str, *options: str) -> list[po.Decoded]:
    """The messages slot `s_<database>` has, consumed; the slot dropped."""
    slot = "s_" + url.rsplit("/", 1)[1]
    rows = sql(url, f"SELECT data FROM pg_logical_slot_get_binary_changes('{slot}', NULL, NULL, "
               "'proto_version', '1', 'publication_names', 'p'" + "".join(
                   f", '{o}'" for o in options) + ")")
    sql(url, f"SELECT pg_drop_replication_slot('{slot}')")
    return [po.decode(bytes(row[0])) for row in rows]


def create_slot(url: str) -> None:
    sql(url, f"SELECT pg_create_logical_replication_slot('s_{url.rsplit('/', 1)[1]}', 'pgoutput')")


def test_every_kind_from_a_real_server(database: str) -> None:
    sql(database,
        "CREATE TYPE mood AS ENUM ('ok', 'sad')",
        "CREATE TABLE t (id int PRIMARY KEY, big text, m mood, note text)",
        "ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL",  # TOASTed, not compressed
        "CREATE PUBLICATION p FOR TABLE t")
    create_slot(database)
    sql(database, "INSERT INTO t VALUES (1, repeat('x', 10000), 'ok', 'a'), (2, NULL, 'sad', 'b')")
    sql(database, "UPDATE t SET note = 'c' WHERE id = 1",  # big unchanged: 'u'
        "UPDATE t SET id = 3 WHERE id = 2",  # the key changed: the old key is sent
        "DELETE FROM t WHERE id = 3",
        "SELECT pg_logical_emit_message(true, 'cf', 'hello')")
    sql(database, "TRUNCATE t")
    sql(database, "SELECT pg_replication_origin_create('elsewhere')",
        "SELECT pg_replication_origin_session_setup('elsewhere')",
        "SELECT pg_replication_origin_xact_setup('0/42', now())",
        "INSERT INTO t VALUES (9, 'y', 'ok', 'z')")
    got = peek(database, "messages", "true")
    relation = next(m for m in got if isinstance(m, po.Relation))
    mood = next(m for m in got if isinstance(m, po.Type))
    assert (relation.qualified, [c.name for c in relation.columns]) == (
        "public.t", ["id", "big", "m", "note"])
    assert [c.key for c in relation.columns] == [True, False, False, False]
    assert (mood.name, mood.oid) == ("mood", relation.columns[2].type_oid)
    got = [m for m in got if not isinstance(m, po.Relation | po.Type)]  # sent again at will
    kinds = [type(m).__name__ for m in got]
    assert kinds == [
        "Begin", "Insert", "Insert", "Commit",
        "Begin", "Update", "Update", "Delete", "Message", "Commit",
        "Begin", "Truncate", "Commit",
        "Begin", "Origin", "Insert", "Commit",
    ], kinds
    first = got[1]
    assert isinstance(first, po.Insert)
    assert first.new == (po.Value.text("1"), po.Value.text("x" * 10000), po.Value.text("ok"),
                         po.Value.text("a"))
    toasted, rekeyed, deleted = got[5], got[6], got[7]
    assert isinstance(toasted, po.Update) and toasted.old is None
    assert toasted.new == (po.Value.text("1"), po.UNCHANGED, po.Value.text("ok"),
                           po.Value.text("c"))
    assert isinstance(rekeyed, po.Update) and rekeyed.old_kind == "K"
    assert rekeyed.old == (po.Value.text("2"), po.NULL, po.NULL, po.NULL)
    assert isinstance(deleted, po.Delete) and deleted.old[0] == po.Value.text("3")
    message = got[8]
    assert isinstance(message, po.Message)
    assert (message.transactional, message.prefix, message.content) == (True, "cf", b"hello")
    truncate = got[11]
    assert isinstance(truncate, po.Truncate) and truncate.relations == (relation.oid,)
    origin = got[14]
    assert isinstance(origin, po.Origin) and (origin.name, origin.lsn) == ("elsewhere", 0x42)
    begin, commit = got[0], got[3]
    assert isinstance(begin, po.Begin) and isinstance(commit, po.Commit)
    assert begin.final_lsn == commit.commit_lsn < commit.end_lsn


def test_binary_values_when_asked(database: str) -> None:
    sql(database, "CREATE TABLE b (id int PRIMARY KEY)", "CREATE PUBLICATION p FOR TABLE b")
    create_slot(database)
    sql(database, "INSERT INTO b VALUES (258)")
    insert = next(m for m in peek(database, "binary", "true") if isinstance(m, po.Insert))
    assert insert.new == (po.Value("b", struct.pack(">i", 258)),)
