"""The capture end to end on a real PostgreSQL (wal_level = logical), a real Redis and real
listeners: the copy and the stream meet under concurrent writers, every committed change once in
commit order, rolled-back transactions never, a large transaction at once, TOASTed values."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import orjson

from publisher.bucket import LogEntry
from publisher.bucket.stores.capture_marks import CaptureMarks, Mark
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.publisher.capture.rig import (
    Writer,
    account,
    prepare,
    rollback,
    section_of,
    sql,
    stream_entries,
)
from tests.publisher.outbox.rig import recorder, until
from tests.servers import RedisServer


async def copied(service: Service, slot: str) -> Mark:
    """The mark of the publisher's copy, once made."""
    marks = CaptureMarks(service.bucket.redis, service.bucket.name)
    found: list[Mark] = []

    async def look() -> bool:
        mark = await marks.read(slot)
        if mark is not None:
            found.append(mark)
        return mark is not None

    for _ in range(2000):
        if await look():
            return found[0]
        await asyncio.sleep(0.01)
    raise AssertionError("the capture made no copy")


async def caught_up(service: Service, writer: Writer, within: float = 20) -> None:
    """Wait until the capture confirmed the writer's last commit."""
    assert service.capture is not None
    last = writer.committed[-1].hi if writer.committed else 0
    stats = service.capture.stats
    await until(lambda: stats.confirmed_lsn >= last, "the capture caught up", within)


async def stored(service: Service) -> dict[str, int]:
    page = await service.bucket.page("vm", None, 10000)
    return {id: orjson.loads(state)["seq"] for id, state in zip(page.ids, page.states,
                                                                   strict=True)}


async def test_copy_and_stream_meet_under_concurrent_writers(
    database: str, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    capture = prepare(database)
    writer = Writer(database)
    await writer.commit([f"vm-{i:03}" for i in range(20)])
    stop = asyncio.Event()
    writing = asyncio.create_task(writer.run(stop))
    await until(lambda: len(writer.committed) > 60, "the writer wrote")
    config = make_config(redis_server.url, capture=section_of(capture, database))
    async with start_publisher(config) as service:
        mark = await copied(service, capture.slot)
        listener = recorder(writer.history, "a", service.url)  # owed what the stream brings
        await until(lambda: len([w for w in writer.committed if w.lo > mark.lsn]) > 100,
                    "the writer wrote after the copy")
        stop.set()
        await writing
        await caught_up(service, writer)
        entries = await stream_entries(service.bucket, mark.head)
        assert account(writer.committed, entries, mark.lsn, writer.history, mark.epoch) == []
        assert await stored(service) == dict(sql(database, "SELECT uuid, seq FROM vms"))
        last = writer.history.attempts[-1]
        assert await listener.caught_up(last, 20)
        verdict = writer.history.verdict()
        assert verdict.problems() == []
        assert verdict.total.lost == verdict.total.duplicated == 0
        await listener.aclose()
    await writer.close()


async def test_rolled_back_never_and_a_large_transaction_at_once(
    database: str, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    capture = prepare(database)
    writer = Writer(database)
    config = make_config(redis_server.url, capture=section_of(capture, database))
    async with start_publisher(config) as service:
        mark = await copied(service, capture.slot)
        listener = recorder(writer.history, "a", service.url)
        await listener.bootstrapped()
        seen: list[int] = []
        paging = asyncio.Event()

        async def page_meanwhile() -> None:  # what a bootstrap page sees of the transaction
            while not paging.is_set():
                page = await service.bucket.page("vm", "big-", 2000)
                seen.append(sum(1 for id in page.ids if id.startswith("big-")))
                await asyncio.sleep(0)

        pager = asyncio.create_task(page_meanwhile())
        for n in range(5):
            await writer.commit([f"vm-{n}"])
            await rollback(writer, [f"rb-{n}-{i}" for i in range(50)] + [f"vm-{n}"])
        await writer.commit([f"big-{i:04}" for i in range(1000)])
        await writer.commit(["vm-last"])
        await caught_up(service, writer)
        paging.set()
        await pager
        entries = await stream_entries(service.bucket, mark.head)
        assert account(writer.committed, entries, mark.lsn, writer.history, mark.epoch) == []
        assert not [e for e in entries if e.changed_resource_id.startswith("rb-")]
        big = [e.position for e in entries if e.changed_resource_id.startswith("big-")]
        assert len(big) == 1000 and len({p.ms for p in big}) == 1  # one script call
        assert big[-1].seq - big[0].seq == 999  # nothing in between
        assert set(seen) <= {0, 1000} and 1000 in seen, sorted(set(seen))
        assert await listener.caught_up(writer.history.attempts[-1], 20)
        verdict = writer.history.verdict()
        assert verdict.problems() == []
        assert verdict.total.lost == verdict.total.duplicated == 0
        rolled_back = {id for id, _ in writer.rolled_back if id.startswith("rb-")}
        assert not [c for c in listener.log.changes if c.id in rolled_back]
        await listener.aclose()
    await writer.close()


async def test_unchanged_toast_comes_from_the_stored_state_and_updates_announce_what_changed(
    database: str, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    capture = prepare(database, "ALTER TABLE vms ALTER COLUMN big SET STORAGE EXTERNAL")
    big = "x" * 20000
    sql(database, "INSERT INTO vms (uuid, seq, big, alias) VALUES ('t1', 1, %s, 'a')",
        args=(big,))
    config = make_config(redis_server.url, capture=section_of(capture, database))
    async with start_publisher(config) as service:
        mark = await copied(service, capture.slot)
        sql(database, "UPDATE vms SET alias = 'b' WHERE uuid = 't1'")  # big unchanged: 'u'
        sql(database, "UPDATE vms SET nics = '[1]' WHERE uuid = 't1'")
        sql(database, "UPDATE vms SET seq = 2, alias = 'c' WHERE uuid = 't1'")
        sql(database, "UPDATE vms SET alias = 'c' WHERE uuid = 't1'")  # changes nothing
        sql(database, "DELETE FROM vms WHERE uuid = 't1'")
        sql(database, "INSERT INTO vms (uuid, seq) VALUES ('t2', 1)")
        entries: list[LogEntry] = []

        async def logged() -> bool:
            entries[:] = await stream_entries(service.bucket, mark.head)
            return len(entries) >= 5

        for _ in range(1000):
            if await logged():
                break
            await asyncio.sleep(0.01)
        every = ("nic", "alias", "state")
        assert [(e.changed_resource_id, e.sub_resources) for e in entries] == [
            ("t1", ("alias",)), ("t1", ("nic",)), ("t1", ("alias", "state")), ("t1", every),
            ("t2", every),
        ]
        assert service.capture is not None and service.capture.stats.set_aside == 0
    sql(database, "UPDATE vms SET seq = 3 WHERE uuid = 't2'")
    sql(database, "INSERT INTO vms (uuid, seq, big) VALUES ('t3', 1, %s)", args=(big,))
    sql(database, "UPDATE vms SET seq = 2 WHERE uuid = 't3'")
    async with start_publisher(config) as service:  # the restart streams from the slot
        await until(lambda: service.capture is not None
                    and service.capture.stats.transactions >= 3, "streamed")
        state = await service.bucket.get("vm", "t3")
        assert state is not None
        assert orjson.loads(state) == {"uuid": "t3", "seq": 2, "nics": None, "alias": None,
                                       "big": big}


async def test_a_20000_row_transaction_reaches_listeners_and_pages_at_once(
    database: str, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    """The suite's large transaction (the bench streams one of 100,000 rows: `--huge`): every
    row delivered once, consecutive in the log (one script call: no other change between),
    and no bootstrap page sees part."""
    rows = 20000
    capture = prepare(database)
    writer = Writer(database)
    config = make_config(redis_server.url, capture=section_of(capture, database))
    async with start_publisher(config) as service:
        mark = await copied(service, capture.slot)
        listener = recorder(writer.history, "a", service.url)
        await listener.bootstrapped()
        seen: list[int] = []
        paging = asyncio.Event()

        probe = [f"huge-{i:05}" for i in range(0, rows, 997)] + [f"huge-{rows - 1:05}"]

        async def page_meanwhile() -> None:  # a page, and rows from first to last at once
            while not paging.is_set():
                page = await service.bucket.page("vm", "huge-", 1000)
                states = await service.bucket.log.states("vm", probe)
                seen.append(sum(1 for id in page.ids if id.startswith("huge-")))
                seen.append(sum(1 for state in states if state is not None) * 1000 // len(probe))
                await asyncio.sleep(0.01)

        pager = asyncio.create_task(page_meanwhile())
        await writer.commit([f"huge-{i:05}" for i in range(rows)])
        await writer.commit(["vm-after"])
        await caught_up(service, writer, within=60)
        paging.set()
        await pager
        entries = await stream_entries(service.bucket, mark.head)
        assert account(writer.committed, entries, mark.lsn, writer.history, mark.epoch) == []
        huge = [e.position for e in entries if e.changed_resource_id.startswith("huge-")]
        assert len(huge) == rows and huge[-1].seq - huge[0].seq == rows - 1  # nothing between
        assert set(seen) <= {0, 1000} and 1000 in seen, sorted(set(seen))
        assert await listener.caught_up(writer.history.attempts[-1], 60)
        verdict = writer.history.verdict()
        assert verdict.problems() == []
        assert verdict.total.lost == verdict.total.duplicated == 0
        assert len({c.id for c in listener.log.changes if c.id.startswith("huge-")}) == rows
        await listener.aclose()
    await writer.close()
