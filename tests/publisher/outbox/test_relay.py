"""The relay end to end: a publisher relaying the outbox to real listeners, exactly once and in
order; read-your-writes; the out-of-order commit; dead rows; a lost LISTEN; a relay that died
between the bucket's commit and the rows' removal."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import aiohttp
import asyncpg
import orjson
import pytest

from changefeed.errors import OutboxRowDead
from faults.harness import FAST
from faults.oracle import History
from listener import Listener
from publisher import outbox
from publisher.bucket import open_bucket
from publisher.config.settings import Config
from publisher.outbox.relay import Relay
from publisher.outbox.rows import CLAIM, batches, key_of, sort_rows
from publisher.outbox.seed import resync
from tests.conftest import PublisherFactory
from tests.publisher.outbox.rig import (
    PgWriter,
    drained,
    outbox_section,
    per_id_order,
    received,
    recorder,
)
from tests.servers import RedisServer, eventually

MakeConfig = Callable[..., Config]


def check(history: History) -> None:
    verdict = history.verdict()
    assert verdict.problems() == []
    assert verdict.total.lost == verdict.total.duplicated == 0
    assert per_id_order(history) == []


async def test_each_row_reaches_each_listener_once_in_order(
    database: str, layout_config: MakeConfig, start_publisher: PublisherFactory,
) -> None:
    """On one Redis, and on a bucket of 4 partitions in a Redis Cluster (each shard remembers
    the batch's idempotency key for the changes it holds)."""
    config = layout_config(4, outbox=outbox_section(database))
    history = History()
    async with start_publisher(config) as service:
        listeners = [recorder(history, name, service.url) for name in ("a", "b")]
        for rec in listeners:
            await rec.bootstrapped()
        writer = PgWriter(database, history, ids=7)
        await writer.connect()
        for _ in range(40):
            await writer.commit()
        for _ in range(10):
            await writer.commit(count=6)  # one transaction, several rows (some of one id)
        for rec in listeners:
            await received(rec, 100)
        assert await writer.resolve() == []
        await writer.close()
        for rec in listeners:
            await rec.aclose()
        store = await service.bucket.get("vm", writer.last.id)
        assert store is not None and orjson.loads(store)["seq"] == writer.last.seq
    check(history)
    assert history.verdict().total.received == 200


async def test_cursor_gives_read_your_writes(
    database: str, redis_server: RedisServer, make_config: MakeConfig,
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url, outbox=outbox_section(database))
    async with start_publisher(config) as service, Listener(
        service.url, instance="ryw", service="outbox", resources={"vm": ["*"]}, config=FAST
    ) as listener:
        reading = asyncio.create_task(_drain(listener))
        conn = await asyncpg.connect(database)
        try:
            async with conn.transaction():
                row = await outbox.put(conn, "vm", "vm-1", ["state"], {"uuid": "vm-1", "n": 1})
            cursor = await outbox.cursor(conn, row, timeout=5)
            await listener.wait_for(cursor, timeout=5)
            stored = await service.bucket.get("vm", "vm-1")
            assert stored is not None and orjson.loads(stored) == {"n": 1, "uuid": "vm-1"}
            async with (  # as docs/http.md says: jsonb's text
                aiohttp.ClientSession() as http,
                http.get(service.url + "/vms/vm-1") as response,
            ):
                assert await response.text() == '{"n": 1, "uuid": "vm-1"}'
            tx = conn.transaction()
            await tx.start()
            rolled = await outbox.put(conn, "vm", "vm-2", ["state"], {"uuid": "vm-2"})
            await tx.rollback()
            with pytest.raises(outbox.OutboxWaitTimeout, match="rolled back"):
                await outbox.cursor(conn, rolled, timeout=0.3)
        finally:
            await conn.close()
            reading.cancel()


async def _drain(listener: Listener) -> None:
    async for _ in listener:
        pass


async def test_a_lower_id_committed_after_a_higher_one_is_relayed(
    database: str, redis_server: RedisServer, make_config: MakeConfig,
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url, outbox=outbox_section(database))
    first, second = await asyncpg.connect(database), await asyncpg.connect(database)
    try:
        async with start_publisher(config):
            late = first.transaction()
            await late.start()
            low = await outbox.put(first, "vm", "vm-a", ["state"], {"uuid": "vm-a"})
            async with second.transaction():
                high = await outbox.put(second, "vm", "vm-b", ["state"], {"uuid": "vm-b"})
            assert low < high
            high_cursor = await outbox.cursor(second, high, timeout=5)  # relayed past `low`
            await late.commit()
            low_cursor = await outbox.cursor(first, low, timeout=5)
            assert low_cursor > high_cursor  # in commit order
    finally:
        await first.close()
        await second.close()


async def test_dead_rows_are_set_aside_and_the_rows_behind_them_flow(
    database: str, redis_server: RedisServer, make_config: MakeConfig,
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url, outbox=outbox_section(database, maxDeadRows=2))
    conn = await asyncpg.connect(database)
    insert = ("INSERT INTO changefeed.outbox (resource, changed_id, sub_resources, op, state) "
              "VALUES ($1, $2, $3, $4, $5::jsonb) RETURNING id")
    try:
        async with conn.transaction():  # rows a service wrote by hand, bypassing the checks
            bad = [
                await conn.fetchval(insert, "disk", "d-1", ["size"], "put", "{}"),
                await outbox.put(conn, "vm", "vm-1", ["state"], {"uuid": "vm-1"}),
                await conn.fetchval(insert, "vm", "vm-2", ["nope"], "publish", None),
                await conn.fetchval(insert, "vm", "vm-3", ["state"], "put", "[1]"),
            ]
            good = await outbox.publish(conn, "vm", "vm-4", ["alias"])
        async with start_publisher(config) as service:
            await outbox.cursor(conn, good, timeout=5)
            await outbox.cursor(conn, bad[1], timeout=5)
            with pytest.raises(OutboxRowDead, match="vm 'vm-3': a put's state must be a JSON "
                                                    "object, got array"):
                await outbox.cursor(conn, bad[3], timeout=5)
            with pytest.raises(OutboxRowDead, match="unknown sub-resource"):
                await outbox.cursor(conn, bad[2], timeout=5)
            assert service.relay is not None and service.relay.stats.dead == 3
            kept = [r["id"] for r in await conn.fetch("SELECT id FROM changefeed.outbox_dead")]
            assert sorted(kept) == [bad[2], bad[3]]  # maxDeadRows: the newest stay
            async with aiohttp.ClientSession() as http:
                async with http.get(service.url + "/metrics") as response:
                    text = await response.text()
                async with http.get(service.url + "/changefeeds/stats") as response:
                    stats = await response.json()
            assert "changefeed_outbox_dead_total 3.0" in text
            assert "changefeed_outbox_relaying 1.0" in text
            assert stats["outbox"]["relaying"] is True and stats["outbox"]["dead"] == 3
            relay = service.relay
            await eventually(lambda: relay.stats.status is not None, "the status read")
            assert relay.stats.status is not None
            assert relay.stats.status.relaying == f"changefeed-relay {service.id}"[:63]
            assert relay.stats.report()["backlog"] == relay.stats.status.backlog
    finally:
        await conn.close()


async def test_the_poll_relays_without_notifications(
    database: str, redis_server: RedisServer, make_config: MakeConfig,
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url, outbox=outbox_section(database, pollInterval=0.1))
    conn = await asyncpg.connect(database)
    try:
        async with start_publisher(config) as service:
            relay = service.relay
            assert relay is not None
            await eventually(lambda: relay.stats.listening, "the relay listens")
            cut = await conn.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name LIKE 'changefeed-listen %'"
            )
            assert cut == 1
            await eventually(lambda: not relay.stats.listening, "the relay noticed")
            row = await outbox.put(conn, "vm", "vm-1", ["state"], {"uuid": "vm-1"})
            await outbox.cursor(conn, row, timeout=2)
            silent = await conn.fetchval(  # no pg_notify at all: a lost notification
                "INSERT INTO changefeed.outbox (resource, changed_id, sub_resources, op) "
                "VALUES ('vm', 'vm-2', '{state}', 'publish') RETURNING id"
            )
            await outbox.cursor(conn, silent, timeout=2)
            await eventually(lambda: relay.stats.listening, "LISTEN is back")
    finally:
        await conn.close()


async def test_a_relay_killed_after_the_commit_is_deduplicated_by_the_key(
    database: str, layout_config: MakeConfig, start_publisher: PublisherFactory,
) -> None:
    """On both layouts: on a Redis Cluster the batch is split by shard, and each shard must
    ignore its part sent again."""
    config = layout_config(4, outbox=outbox_section(database))
    assert config.outbox is not None
    plain = replace(config, outbox=None)
    history = History()
    async with start_publisher(plain) as service:
        rec = recorder(history, "a", service.url)
        await rec.bootstrapped()
        writer = PgWriter(database, history)
        await writer.connect()
        for _ in range(5):
            await writer.commit(count=4)
        # A relay that claimed the rows, committed them to the bucket and died before removing
        # any: what PostgreSQL and Redis hold then.
        bucket = open_bucket(config)
        dying = Relay(bucket, config.outbox, config.resource_map, database, "dying")
        install_id = await writer.conn.fetchval(
            "SELECT install_id::text FROM changefeed.outbox_schema")
        (batch,) = batches(await writer.conn.fetch(CLAIM, 100))
        relay, _ = sort_rows(batch.records, dying.resources)
        first, _ = await dying._commit(relay, key_of(install_id, batch.id))
        await received(rec, 20)
        assert await writer.conn.fetchval("SELECT count(*) FROM changefeed.outbox") == 20
        # The next relay sends the same batch again, under its key: the bucket writes nothing.
        successor = Relay(bucket, config.outbox, config.resource_map, database, "successor")
        successor.start()
        await drained(database)
        await successor.stop()
        again = dict(await writer.conn.fetch("SELECT id, cursor FROM changefeed.outbox_relayed"))
        assert again == {row.id: cursor for row, cursor in first}
        await writer.commit(count=3)
        successor.start()
        await received(rec, 23)
        await drained(database)
        await successor.stop()
        await bucket.aclose()
        assert await writer.resolve() == []
        await writer.close()
        await rec.aclose()
    check(history)
    assert len(history.listeners["a"].changes) == 23


async def test_a_resync_by_hand_is_done_by_the_relaying_publisher(
    database: str, layout_config: MakeConfig, start_publisher: PublisherFactory,
) -> None:
    """On both layouts: on a Redis Cluster the new epoch reaches every shard."""
    config = layout_config(4, outbox=outbox_section(database))
    assert config.outbox is not None
    conn = await asyncpg.connect(database)
    try:
        async with start_publisher(config) as service:
            relay = service.relay
            assert relay is not None
            await eventually(lambda: relay.stats.listening, "the relay listens")
            await conn.execute("""INSERT INTO vms VALUES ('vm-1', '{"uuid": "vm-1", "seq": 5}')""")
            epoch = await service.bucket.log.current_epoch()
            asked = await resync(conn, service.bucket, config.outbox, config.resource_map, "vm")
            assert asked == f"changefeed-relay {service.id}"[:63]
            await eventually(lambda: relay.stats.reseeds == 1, "the relay re-seeded")
            stored = await service.bucket.get("vm", "vm-1")
            assert stored is not None and orjson.loads(stored)["seq"] == 5
            assert await service.bucket.log.current_epoch() not in (None, epoch)  # one Resync each
    finally:
        await conn.close()
