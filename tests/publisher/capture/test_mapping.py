"""What the capture makes of a table's changes on a real server: a Moray-shaped table, DDL on a
mapped table (its rows set aside with the reason; unmapped columns free), an idle slot whose
position moves on, the lag in /metrics and /changefeeds/stats, and a slot invalidated by
max_slot_wal_keep_size while the publisher was stopped."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import orjson
import psycopg2

from publisher.bucket import LogEntry
from publisher.bucket.stores.capture_marks import CaptureMarks
from publisher.capture.pgoutput import parse_lsn
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.publisher.capture.rig import prepare, section_of, sql, stream_entries
from tests.publisher.capture.test_failover import confirmed
from tests.publisher.capture.test_stream import copied
from tests.publisher.outbox.rig import until
from tests.servers import RedisServer

MORAY = ("CREATE TABLE vmapi_vms (_key text PRIMARY KEY, _value text NOT NULL, _etag char(8), "
         "_mtime bigint NOT NULL, _id serial, _txn_snap integer, _vnode bigint, state text)")
"""A Moray bucket's table: the object's JSON in _value, one column per index."""
MORAY_MAPPING = {"resource": "vm", "moray": True,
                 "subResources": {"nic": ["nics"], "state": ["state"]}}
EVERY = ("nic", "alias", "state")


def moray_put(url: str, key: str, value: dict[str, object], etag: str) -> None:
    """What Moray's putObject does: the whole row, _value and its bookkeeping columns."""
    sql(url, "INSERT INTO vmapi_vms (_key, _value, _etag, _mtime, state) VALUES "
        "(%s, %s, %s, (extract(epoch FROM now()) * 1000)::bigint, %s) ON CONFLICT (_key) DO "
        "UPDATE SET _value = EXCLUDED._value, _etag = EXCLUDED._etag, _mtime = EXCLUDED._mtime, "
        "state = EXCLUDED.state",
        args=(key, orjson.dumps(value).decode(), etag, value.get("state")))


async def logged(service: Service, head: str, count: int) -> list[LogEntry]:
    entries: list[LogEntry] = []
    for _ in range(1500):
        entries = await stream_entries(service.bucket, head)
        if len(entries) >= count:
            return entries
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(entries)} of {count} entries: {entries}")


async def test_a_moray_table(
    database: str, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    tables = {"public.vmapi_vms": MORAY_MAPPING}
    capture = prepare(database, MORAY, tables=tables)
    vm: dict[str, object] = {"uuid": "m1", "state": "running", "nics": [{"mac": "a"}],
                             "alias": "web"}
    moray_put(database, "m1", vm, "AAAAAAAA")
    config = make_config(redis_server.url, capture=section_of(capture, database, tables))
    async with start_publisher(config) as service:
        mark = await copied(service, capture.slot)
        assert orjson.loads(await service.bucket.get("vm", "m1") or b"") == vm
        moray_put(database, "m1", {**vm, "state": "stopped"}, "BBBBBBBB")
        moray_put(database, "m1", {**vm, "state": "stopped"}, "CCCCCCCC")  # its etag only
        moray_put(database, "m1", {**vm, "state": "stopped", "nics": []}, "DDDDDDDD")
        moray_put(database, "m2", {"uuid": "m2"}, "EEEEEEEE")
        sql(database, "DELETE FROM vmapi_vms WHERE _key = 'm2'")
        entries = await logged(service, mark.head, 4)
        assert [(e.changed_resource_id, e.sub_resources) for e in entries] == [
            ("m1", ("state",)), ("m1", ("nic",)), ("m2", EVERY), ("m2", EVERY),
        ]
        assert orjson.loads(await service.bucket.get("vm", "m1") or b"") == {
            **vm, "state": "stopped", "nics": []}
        assert await service.bucket.get("vm", "m2") is None


async def test_ddl_on_a_mapped_column_sets_rows_aside_and_unmapped_columns_are_free(
    database: str, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    capture = prepare(database)
    sql(database, "INSERT INTO vms (uuid, seq, alias) VALUES ('d1', 1, 'a')")
    config = make_config(redis_server.url, capture=section_of(capture, database))
    async with start_publisher(config) as service:
        assert service.capture is not None
        stats = service.capture.stats
        mark = await copied(service, capture.slot)
        sql(database, "ALTER TABLE vms ADD COLUMN extra int")  # unmapped: free
        sql(database, "UPDATE vms SET seq = 2, extra = 7 WHERE uuid = 'd1'")
        await logged(service, mark.head, 1)
        assert orjson.loads(await service.bucket.get("vm", "d1") or b"")["extra"] == 7
        sql(database, "ALTER TABLE vms DROP COLUMN extra")
        sql(database, "UPDATE vms SET seq = 3 WHERE uuid = 'd1'")
        await logged(service, mark.head, 2)
        sql(database, "ALTER TABLE vms RENAME COLUMN alias TO nickname")
        sql(database, "UPDATE vms SET seq = 4 WHERE uuid = 'd1'")
        await until(lambda: stats.set_aside == 1, "the row was set aside")
        gone = "column alias of public.vms is gone (dropped or renamed): the mapping needs it"
        assert stats.ddl == [gone]
        sql(database, "ALTER TABLE vms RENAME COLUMN nickname TO alias",
            "ALTER TABLE vms ALTER COLUMN seq TYPE bigint")
        sql(database, "UPDATE vms SET seq = 5 WHERE uuid = 'd1'")
        await until(lambda: stats.set_aside == 2, "the row was set aside")
        assert stats.ddl[-1] == "column seq of public.vms changed type from int4 to int8"
        assert orjson.loads(await service.bucket.get("vm", "d1") or b"")["seq"] == 3
        aside = await CaptureMarks(service.bucket.redis, "test").aside(capture.slot)
        assert [orjson.loads(a)["reason"] for a in aside] == [stats.ddl[-1], gone]
        assert len(await stream_entries(service.bucket, mark.head)) == 2


async def test_an_idle_slot_moves_on_and_the_lag_is_shown(
    database: str, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    capture = prepare(database, "CREATE TABLE other (n int)")
    config = make_config(redis_server.url, capture=section_of(capture, database))
    async with start_publisher(config) as service:
        await copied(service, capture.slot)
        assert service.capture is not None
        stats = service.capture.stats
        await until(lambda: stats.lag_bytes is not None, "the lag was read")
        sql(database, "INSERT INTO other SELECT generate_series(1, 20000)")  # unmapped
        (end,) = sql(database, "SELECT pg_current_wal_lsn()::text")[0]
        await until(lambda: confirmed(database, capture.slot) >= parse_lsn(end),
                    "the idle slot's position moved on", within=30)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{service.url}/metrics") as reply:
                metrics = await reply.text()
            async with session.get(f"{service.url}/changefeeds/stats") as reply:
                body = await reply.json()
        assert "changefeed_capture_lag_bytes" in metrics
        assert "changefeed_capture_streaming 1.0" in metrics
        assert body["capture"]["streaming"] is True
        assert isinstance(body["capture"]["lagBytes"], int)


async def test_a_slot_invalidated_while_the_publisher_was_stopped_means_a_new_copy(
    database: str, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    capture = prepare(database, "CREATE TABLE other (n int, pad text)")
    sql(database, "INSERT INTO vms (uuid, seq) VALUES ('i1', 1)")
    config = make_config(redis_server.url, capture=section_of(capture, database))
    async with start_publisher(config) as service:
        first = await copied(service, capture.slot)
    sql(database, "INSERT INTO vms (uuid, seq) VALUES ('i2', 1)")  # the slot keeps it, then not
    admin = database.rsplit("/", 1)[0] + "/postgres"
    try:  # a small max_slot_wal_keep_size, and more WAL than it: the next checkpoint drops it
        autocommit(admin, "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        autocommit(admin, "SELECT pg_reload_conf()")
        for _ in range(3):
            sql(database, "INSERT INTO other SELECT n, repeat('x', 500) FROM "
                "generate_series(1, 20000) n", "SELECT pg_switch_wal()")
            autocommit(database, "CHECKPOINT")
        (status,) = sql(database, "SELECT wal_status FROM pg_replication_slots WHERE "
                        "slot_name = %s", args=(capture.slot,))[0]
        assert status == "lost"
    finally:
        autocommit(admin, "ALTER SYSTEM RESET max_slot_wal_keep_size")
        autocommit(admin, "SELECT pg_reload_conf()")
    async with start_publisher(config) as service:
        marks = CaptureMarks(service.bucket.redis, service.bucket.name)
        assert service.capture is not None
        stats = service.capture.stats
        await until(lambda: stats.copies == 1 and stats.streaming, "copied again")
        renewed = await marks.read(capture.slot)
        assert renewed is not None and renewed.epoch != first.epoch and renewed.lsn > first.lsn
        assert await service.bucket.get("vm", "i2") is not None  # in the new copy


def autocommit(url: str, statement: str) -> None:
    """Run `statement` outside a transaction (ALTER SYSTEM, CHECKPOINT)."""
    conn = psycopg2.connect(url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(statement)
    finally:
        conn.close()


async def test_redis_emptied_means_a_new_copy_and_a_resync(
    database: str, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    capture = prepare(database, "ALTER TABLE vms ALTER COLUMN big SET STORAGE EXTERNAL")
    sql(database, "INSERT INTO vms (uuid, seq, big) VALUES ('e1', 1, repeat('y', 9000))")
    config = make_config(redis_server.url, capture=section_of(capture, database))
    async with start_publisher(config) as service:
        first = await copied(service, capture.slot)
        assert service.capture is not None
        stats = service.capture.stats
        await service.bucket.redis.flushall()  # as a Redis restarted without its data
        sql(database, "UPDATE vms SET seq = 2 WHERE uuid = 'e1'")  # big: an unchanged TOAST
        await until(lambda: stats.copies == 2, "copied again")
        renewed = await CaptureMarks(service.bucket.redis, "test").read(capture.slot)
        assert renewed is not None and renewed.epoch != first.epoch
        state = orjson.loads(await service.bucket.get("vm", "e1") or b"")
        assert (state["seq"], len(state["big"])) == (2, 9000)
        assert stats.set_aside == 0  # nothing planned against the emptied store
