"""Groups of transactions in one script call, exactly once: a group of which some transactions
were applied already (a session that died before its confirmation reached the slot) applies
only the others; a group whose script call fails part way (a key of the wrong type) leaves the
slot's confirmed position before the transaction that failed, and once the key is fixed every
transaction is in the log once, in commit order."""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg2
import pytest

from changefeed.protocol import Resource
from publisher.bucket import ChangeBucket, connect
from publisher.bucket.stores.capture_marks import CaptureMarks, Mark
from publisher.capture import pgoutput as po
from publisher.capture.assemble import Assembler, Transaction
from publisher.capture.runner import CaptureRunner
from publisher.config.capture import Capture
from tests.publisher.capture.rig import MAPPING, prepare, sql, stream_entries
from tests.publisher.outbox.rig import until
from tests.servers import RedisServer

RESOURCES = [Resource("vm", ("nic", "alias", "state"), "/vms"),
             Resource("network", ("ips", "name"), "/networks")]
NETS = "CREATE TABLE nets (uuid text PRIMARY KEY, name text)"
TABLES = {"public.vms": MAPPING,
          "public.nets": {"resource": "network", "id": "uuid",
                          "subResources": {"ips": ["name"], "name": ["name"]}}}


@pytest.fixture
async def bucket(redis_server: RedisServer) -> AsyncIterator[ChangeBucket]:
    made = ChangeBucket(connect(redis_server.url), "test", RESOURCES)
    yield made
    await made.aclose()


def prepared(url: str) -> Capture:
    return prepare(url, NETS, tables=TABLES,
                   resources={r.resource: list(r.sub_resources) for r in RESOURCES})


def runner_of(bucket: ChangeBucket, capture: Capture, url: str) -> CaptureRunner:
    return CaptureRunner(bucket, capture, {r.resource: r for r in RESOURCES}, url, "test")


async def copied(bucket: ChangeBucket, capture: Capture, url: str) -> Mark:
    """The slot made and its (empty) tables copied, by a capture stopped after."""
    runner = runner_of(bucket, capture, url)
    runner.start()
    try:
        await until(lambda: runner.stats.copies > 0, "the copy")
    finally:
        await runner.stop()
    mark = await CaptureMarks(bucket.redis, bucket.name).read(capture.slot)
    assert mark is not None
    return mark


def insert(url: str, table: str, id: str) -> tuple[int, int]:
    """One transaction inserting row `id`: WAL positions before its commit and after it."""
    conn = psycopg2.connect(url)
    try:
        with conn, conn.cursor() as cur:
            columns = "uuid, seq" if table == "vms" else "uuid, name"
            cur.execute(f"INSERT INTO {table} ({columns}) VALUES (%s, 1)", (id,))
            cur.execute("SELECT pg_current_wal_insert_lsn()::text")
            (lo,), = cur.fetchall()
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_insert_lsn()::text")
            (hi,), = cur.fetchall()
    finally:
        conn.close()
    return po.parse_lsn(lo), po.parse_lsn(hi)


def confirmed(url: str, slot: str) -> int:
    (lsn,), = sql(url, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                  "WHERE slot_name = %s", args=(slot,))
    return po.parse_lsn(lsn)


def peeked(url: str, capture: Capture) -> list[Transaction]:
    """The transactions the slot holds, read without consuming them."""
    rows = sql(url, "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
               "'proto_version', '1', 'publication_names', %s)",
               args=(capture.slot, capture.publication))
    assembler = Assembler(capture)
    out = []
    for (data,) in rows:
        if (txn := assembler.feed(po.decode(bytes(data)))) is not None:
            out.append(txn)
    return out


async def logged(bucket: ChangeBucket, mark: Mark) -> list[str]:
    return [e.changed_resource_id for e in await stream_entries(bucket, mark.head)]


async def test_a_group_with_transactions_applied_already_applies_only_the_others(
    database: str, bucket: ChangeBucket,
) -> None:
    capture = prepared(database)
    mark = await copied(bucket, capture, database)
    ids = [f"vm-{n:02}" for n in range(30)]
    ends = [insert(database, "vms", id)[1] for id in ids]
    txns = peeked(database, capture)
    assert [t.rows[0].id for t in txns] == ids
    # A session applied these (a prefix, and one further on), then died before confirming.
    before = CaptureMarks(bucket.redis, bucket.name)
    applied = [*txns[:10], txns[17]]
    earlier = runner_of(bucket, capture, database)
    assert await earlier.apply(applied, mark)
    assert confirmed(database, capture.slot) < txns[0].end_lsn
    runner = runner_of(bucket, capture, database)
    runner.start()
    try:
        await until(lambda: confirmed(database, capture.slot) >= ends[-1], "the slot confirmed")
        assert runner.stats.transactions == len(ids) - len(applied)
    finally:
        await runner.stop()
    assert await logged(bucket, mark) == [*ids[:10], ids[17], *ids[10:17], *ids[18:]]
    assert (await before.read(capture.slot)) == mark, "no copy again"


async def test_a_group_failing_part_way_confirms_nothing_past_the_failure(
    database: str, bucket: ChangeBucket,
) -> None:
    capture = prepared(database)
    mark = await copied(bucket, capture, database)
    written = [("vms", "vm-0"), ("vms", "vm-1"), ("nets", "net-2"), ("vms", "vm-3")]
    spans = [insert(database, table, id) for table, id in written]
    await bucket.redis.set(bucket.keys.index("network"), "not a set")  # net-2 fails in the call
    runner = runner_of(bucket, capture, database)
    runner.start()
    try:
        await until(lambda: runner.stats.postgres_errors >= 2, "the group failed, twice")
        assert confirmed(database, capture.slot) <= spans[2][0], "not past net-2"
        assert await logged(bucket, mark) == ["vm-0", "vm-1"], "the two before, whole"
        await bucket.redis.delete(bucket.keys.index("network"))
        await until(lambda: confirmed(database, capture.slot) >= spans[-1][1],
                    "the slot confirmed", within=10)
    finally:
        await runner.stop()
    assert await logged(bucket, mark) == [id for _, id in written]
    assert await bucket.get("network", "net-2") is not None
