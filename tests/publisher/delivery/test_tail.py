"""The tail's checks (reliability issue 11): a tail that fell behind trimming, a Redis that rolled
back, a Redis that came back empty. Each must reach every listener that cannot continue without
a gap as a 4009 and, on its next registration, `resumed: false` (a `Resync` and a bootstrap for
`listener.Listener`), never as silence.

The checks themselves (`assess`) are pure and tested first, without Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from structlog.testing import capture_logs
from websockets.exceptions import ConnectionClosed

from changefeed.cursor import Position, StreamId
from changefeed.errors import BucketUnavailable
from listener import Backoff, Listener, ListenerConfig
from publisher.bucket import Change, ChangeBucket, Log, LogEntry, LogRead, Shard
from publisher.config.settings import Config, load_config
from publisher.delivery.hub import RECREATED, ROLLED_BACK, TRIMMED
from publisher.delivery.tail import Gap, NewHistory, added_after, assess
from tests.conftest import PublisherFactory
from tests.failpoint import FailOnce
from tests.listener.app import View, bucket_of, consuming, publisher_process, store_objects, vm
from tests.servers import PublisherProcess, RedisServer, eventually, scaled, write_config
from tests.wsclient import Feed, register, v1

# --- assess: pure ---------------------------------------------------------------------------


def _id(n: int) -> StreamId:
    return StreamId(1000, n)


def _read(
    *,
    entries: int = 0,
    after: int = 10,
    epoch: str | None = "e1",
    partitions: int | None = 1,
    head: int = 20,
    trimmed: int = 0,
    witnessed: bool = True,
    length: int = 20,
    added: int | None = 20,
    complete: bool = True,
) -> LogRead:
    rows = [LogEntry(_id(after + 1 + i), "vm", ("nic",), f"vm-{i}") for i in range(entries)]
    return LogRead(rows, complete, epoch, partitions, _id(head), _id(trimmed), witnessed,
                   length, added)


def test_a_read_of_the_same_history_is_no_fault() -> None:
    assert assess(_read(entries=3), _id(10), "e1", 1, 10) is None
    # The trimmed horizon at the position itself: the position's successor is still there.
    assert assess(_read(trimmed=10), _id(10), "e1", 1, 10) is None


def test_trimmed_past_the_position_is_a_gap_of_the_items_gone_unread() -> None:
    # 20 entries ever added, 10 read; trimmed up to 15, 5 left: 16..20.
    read = _read(entries=5, trimmed=15, length=5, added=20, complete=True)
    assert assess(read, _id(10), "e1", 1, 10) == Gap(_id(10), _id(15), 5)
    assert assess(read, _id(10), "e1", 1, None) == Gap(_id(10), _id(15), None)
    assert assess(_read(trimmed=15, added=None), _id(10), "e1", 1, 10) == Gap(
        _id(10), _id(15), None
    )


def test_another_epoch_or_none_is_a_new_history_not_a_rollback() -> None:
    fault = assess(_read(epoch="e2"), _id(10), "e1", 1, 10)
    assert isinstance(fault, NewHistory) and not fault.rollback and "e2" in fault.reason
    fault = assess(_read(epoch=None, head=0, trimmed=0), _id(10), "e1", 1, 10)
    assert isinstance(fault, NewHistory) and not fault.rollback and "gone" in fault.reason


@pytest.mark.parametrize(
    ("read", "why"),
    [
        (_read(head=8, witnessed=False), "behind"),
        (_read(head=30, witnessed=False), "gone but was not trimmed"),
        (_read(partitions=None), "partition count"),
        (_read(partitions=4), "partition count"),
    ],
    ids=["head-went-back", "position-gone", "partitions-key-gone", "partitions-changed"],
)
def test_a_log_that_lost_what_the_tail_saw_is_a_rollback(read: LogRead, why: str) -> None:
    fault = assess(read, _id(10), "e1", 1, 10)
    assert isinstance(fault, NewHistory) and fault.rollback and why in fault.reason


def test_the_count_of_entries_up_to_the_position_follows_each_read() -> None:
    assert added_after(_read(entries=3, added=13), 10, None) == 13, "complete: Redis's count"
    partial = _read(entries=3, added=50, complete=False)
    assert added_after(partial, 10, None) == 13, "a full batch: counted on"
    assert added_after(partial, None, None) is None
    gap = _read(entries=3, added=50, length=7, complete=False)
    assert added_after(gap, 10, Gap(_id(10), _id(40), 30)) == 46, "all but the 4 still unread"
    assert added_after(_read(added=None), 10, None) is None


# --- real servers -----------------------------------------------------------------------------

FAST = ListenerConfig(backoff=Backoff(initial=0.02, maximum=0.2), page_size=500,
                      ping_interval=None, heartbeat_interval=None, open_timeout=2)
"""No pings from the listener: a stopped publisher must not look dead to it (that would make it
reconnect by itself, and the tail's own detection would go untested)."""
QUIET = {"pingInterval": 60}


def _stop(process: PublisherProcess) -> None:
    """SIGSTOP, returning once the kernel shows the process stopped."""
    assert process.process is not None
    pid = process.process.pid
    process.process.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + scaled(5)
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the publisher did not stop"
        time.sleep(0.001)


def _cont(process: PublisherProcess) -> None:
    assert process.process is not None
    process.process.send_signal(signal.SIGCONT)


@contextlib.contextmanager
def stopped(process: PublisherProcess) -> Iterator[None]:
    _stop(process)
    try:
        yield
    finally:
        _cont(process)


async def _until_closed(feed: Feed) -> tuple[list[dict[str, Any]], int, str]:
    """The items `feed` still gets, then the code and reason of its close frame."""
    items = []
    while True:
        try:
            items.append(await feed.next(10))
        except ConnectionClosed as exc:
            assert exc.rcvd is not None, "closed without a close frame"
            return items, exc.rcvd.code, exc.rcvd.reason


async def _get_json(url: str) -> Any:
    timeout = aiohttp.ClientTimeout(total=scaled(35))
    async with aiohttp.ClientSession(timeout=timeout) as http, http.get(url) as response:
        assert response.status == 200, await response.text()
        return await response.json()


def _changes(prefix: str, n: int) -> list[Change]:
    return [Change.put("vm", f"{prefix}-{i:04}", ["nic"], vm(f"{prefix}-{i:04}")) for i in range(n)]


async def _trimmed_past(bucket: ChangeBucket, position: StreamId, within: float = 10) -> None:
    """Wait until another publisher's GC has trimmed the log past `position` (Redis holds the
    horizon; there is no event to wait on)."""
    deadline = time.monotonic() + scaled(within)
    while (await bucket.log.retention()).trimmed < position:
        assert time.monotonic() < deadline, "the other publisher's GC did not trim"
        await asyncio.sleep(0.05)




async def test_a_publisher_stopped_while_another_trims_makes_its_listeners_bootstrap_again(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Issue 11, item 1: two publishers (maxItems 100, gcInterval 1); B stopped while 900
    changes are committed and A trims. B's listener gets a Resync and a bootstrap that covers
    the store; nothing acknowledged is lost unannounced."""
    path = write_config(tmp_path / "config.js", redis_server.url, maxItems=100, gcInterval=1,
                        limits=QUIET)
    async with (
        bucket_of(load_config(path)) as bucket,
        publisher_process(path) as a,
        publisher_process(path) as b,
    ):
        await bucket.commit_many(_changes("old", 50))
        feed = Listener(b.url, instance="i-1", service="tcns", resources={"vm": ["nic"]},
                        config=FAST)
        view = View(feed)
        raw = await register(b.ws_url, v1("vm", ["nic"], instance="raw"))
        closing = asyncio.create_task(_until_closed(raw))  # read as it comes: never slow
        async with consuming(view):
            await view.wait_for(lambda: view.counts["BootstrapDone"] == 1)
            seen = await bucket.commit("vm", "seen", ["nic"], vm("seen"))
            await view.wait_for(lambda: view.cursor == seen)
            with stopped(b):
                # Fewer than the tail's BATCH: A's tail reads the burst in one atomic read,
                # so its own GC (maxItems 100) cannot trim between two of its reads.
                cursors = await bucket.commit_many(_changes("burst", 900))
                await _trimmed_past(bucket, Position.decode(cursors[700]).position)
            await view.wait_for(lambda: view.counts["BootstrapDone"] == 2)
            assert view.counts["Resync"] == 1
            last = await bucket.commit("vm", "last", ["nic"], vm("last"))
            await view.wait_for(lambda: view.cursor == last)
            assert view.objects["vm"] == await store_objects(bucket, "vm")

        items, code, reason = await closing
        assert (code, reason) == (4009, TRIMMED)
        got = [Position.decode(i["cursor"]).position for i in items]
        assert got == [Position.decode(c).position for c in [seen, *cursors]][: len(got)], (
            "what it was sent before the close has no gap"
        )
        again = await register(b.ws_url, v1("vm", ["nic"], since=items[-1]["cursor"]))
        assert again.reply["resumed"] is False
        await again.close()

        stats = await _get_json(b.url + "/changefeeds/stats")
        assert stats["tail"]["trimGaps"] == 1
        # At least what was trimmed when B was let go, of what it had not been sent.
        assert stats["tail"]["itemsLost"] >= 700 - len(items), stats["tail"]
        assert stats["closed"]["trimGap"] == 2, "the listener and the raw socket"
        assert "tail fell behind the trim horizon" in b.output()
        assert "tail fell behind" not in a.output(), "A kept up"


async def test_a_stalled_tail_under_another_writers_trim_closes_listeners_and_long_polls_miss(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """One publisher; another writer trims (its GC) while the publisher is stopped. The live
    socket gets 4009 with the exact item where its stream broke, a waiting long poll answers
    `missed`, a socket resuming ahead of the gap is not disturbed, and the gap is counted."""
    path = write_config(tmp_path / "config.js", redis_server.url, limits=QUIET)
    async with bucket_of(load_config(path)) as bucket, publisher_process(path) as b:
        first = await bucket.commit_many(_changes("a", 10))
        live = await register(b.ws_url, v1("vm", ["nic"], instance="live"))
        # A long poll for something nobody commits: it waits through the stop.
        head = live.reply["cursor"]
        closing = asyncio.create_task(_until_closed(live))
        poll = asyncio.create_task(_get_json(
            f"{b.url}/changefeeds/events?resource=vm&sub=alias&after={head}&wait_time=30s"))
        with stopped(b):
            burst = await bucket.commit_many(_changes("b", 2000))
            removed = await bucket.log.trim(None, 100)
            assert removed == 1910
            horizon = (await bucket.log.retention()).trimmed
            # Resumes at the horizon itself: it has missed nothing, it only waits for the tail.
            at_horizon = Position.single(Position.decode(burst[0]).epoch, horizon).encode()
            ahead = asyncio.create_task(register(
                b.ws_url, v1("vm", ["nic"], instance="ahead", since=at_horizon)))
        items, code, reason = await closing
        assert (code, reason) == (4009, TRIMMED)
        sent = [i["cursor"] for i in items]
        assert sent == burst[: len(sent)], "a gap-free prefix, then the close"
        lost = [c for c in burst[len(sent):] if Position.decode(c).position <= horizon]
        assert lost, "the close announces a real gap"

        answer = await poll
        # "... trimmed while waiting" if it was waiting when B stopped, else "after is older
        # than the retained log: items after it were trimmed": both at once, not after 30 s.
        assert answer["missed"] is True, answer
        assert "trimmed" in answer["missed_reason"]

        resumed = await ahead
        assert resumed.reply["resumed"] is True
        assert [i["cursor"] for i in await resumed.take(100)] == burst[-100:]
        again = await register(b.ws_url, v1("vm", ["nic"], since=first[-1]))
        assert again.reply["resumed"] is False

        stats = await _get_json(b.url + "/changefeeds/stats")
        assert stats["tail"]["trimGaps"] == 1
        assert stats["tail"]["itemsLost"] == len(lost), stats["tail"]
        assert stats["tail"]["itemsBehind"] == 0 and stats["tail"]["healthy"] is True
        assert all(r["itemsBehindHead"] == 0 for r in stats["registrations"])
        for feed in (resumed, again):
            await feed.close()


async def test_a_resume_replayed_from_redis_that_falls_behind_trimming_is_closed(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    """The replay path checks the horizon in the same read: a resuming socket that stops
    reading while the log is trimmed past it gets 4009, not the items after the gap."""
    config = make_config(redis_server.url, limits={"window": 20, "sendBuffer": 16384,
                                                    "pingInterval": 60})
    async with start_publisher(config) as service:
        bucket = service.bucket
        # Long ids make long items: kernel buffers cannot hide that the socket is not read.
        cursors = await bucket.commit_many(
            Change.put("vm", f"v{i:05}-" + "x" * 450, ["nic"], {}) for i in range(10000)
        )
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        host, port = service.url.removeprefix("http://").rsplit(":", 1)
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        slow = await register(service.ws_url, v1("vm", ["nic"], since=cursors[0]),
                              max_size=None, max_queue=1, sock=sock)
        assert slow.reply["resumed"] is True
        (conn,) = service.hub.connections
        await eventually(lambda: conn.replaying and conn.last_sent is not None
                         and conn.transport.get_write_buffer_size() > 16384,
                         "the replay fills the socket")
        await bucket.log.trim(None, 10)
        items, code, reason = await _until_closed(slow)
        assert (code, reason) == (4009, TRIMMED)
        got = [i["cursor"] for i in items]
        assert got == cursors[1: 1 + len(got)] and len(got) < len(cursors) - 10
        assert service.hub.counters.closed["trimGap"] == 1


def _snapshot_redis(tmp: Path) -> RedisServer:
    """A Redis on a fixed TCP port with no persistence of its own: the test saves (SAVE) and
    restores its RDB file by hand."""
    return RedisServer(tmp, tcp=True, persist=False).start()


async def test_redis_restored_from_an_older_snapshot_starts_a_new_epoch(
    tmp_path_factory: pytest.TempPathFactory, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    """Issue 11, item 2: Redis restored from a snapshot taken before 305 acknowledged commits.
    Both publishers notice (one new epoch between them), every listener gets 4009, a `since`
    from before is not resumed, and `listener.Listener` resyncs to the restored store."""
    directory = tmp_path_factory.mktemp("redis")
    server = _snapshot_redis(directory)
    try:
        config = make_config(server.url, limits=QUIET)
        async with start_publisher(config) as a, start_publisher(config) as b:
            bucket = a.bucket
            kept = await bucket.commit_many(_changes("kept", 100))
            await bucket.redis.save()
            snapshot = directory / "snapshot.rdb"
            shutil.copy(directory / "dump.rdb", snapshot)

            view = View(Listener(b.url, instance="i-1", service="tcns",
                                 resources={"vm": ["nic"]}, config=FAST))
            raw = await register(a.ws_url, v1("vm", ["nic"], instance="raw"))
            async with consuming(view):
                await view.wait_for(lambda: view.counts["BootstrapDone"] == 1)
                lost = await bucket.commit_many(_changes("lost", 305))
                await view.wait_for(lambda: view.cursor == lost[-1])
                assert [i["cursor"] for i in await raw.take(305)] == lost
                old = a.hub.epoch

                with capture_logs() as logs:
                    server.kill()
                    shutil.copy(snapshot, directory / "dump.rdb")
                    server.start()
                    items, code, reason = await _until_closed(raw)
                    # ROLLED_BACK from the publisher that saw it first; the other may read the
                    # new epoch before it reads its own witness gone.
                    assert items == [] and code == 4009 and reason in (ROLLED_BACK, RECREATED)
                    await view.wait_for(lambda: view.counts["BootstrapDone"] == 2)
                assert view.counts["Resync"] == 1
                async with bucket_of(config) as fresh:  # a's client lost its connection
                    restored = await store_objects(fresh, "vm")
                    assert len(restored) == 100, "the snapshot's store"
                    assert view.objects["vm"] == restored
                    after = await fresh.commit("vm", "after", ["nic"], vm("after"))
                await view.wait_for(lambda: view.cursor == after)

            assert a.hub.epoch == b.hub.epoch != old
            assert Position.decode(after).epoch == a.hub.epoch
            errors = [e for e in logs if e["event"].startswith("bucket rolled back")]
            assert errors and all(e["log_level"] == "error" for e in errors), logs
            assert {e["old"] for e in errors} == {old}
            assert StreamId.parse(errors[0]["head"]) < StreamId.parse(errors[0]["seen"])
            assert a.tail.faults.rollbacks + b.tail.faults.rollbacks >= 1

            for service in (a, b):
                again = await register(service.ws_url, v1("vm", ["nic"], since=lost[-1]))
                assert again.reply["resumed"] is False
                await again.close()
                behind = await register(service.ws_url, v1("vm", ["nic"], since=kept[-1]))
                assert behind.reply["resumed"] is False, "an old-epoch cursor inside the log"
                await behind.close()
    finally:
        server.stop()


async def test_redis_restarted_empty_is_a_new_epoch_for_every_listener(
    tmp_path_factory: pytest.TempPathFactory, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    """Redis without persistence restarted: epoch and partition count are gone with the log."""
    directory = tmp_path_factory.mktemp("redis")
    server = _snapshot_redis(directory)
    try:
        async with start_publisher(make_config(server.url, limits=QUIET)) as service:
            cursors = await service.bucket.commit_many(_changes("gone", 20))
            view = View(Listener(service.url, instance="i-1", service="tcns",
                                 resources={"vm": ["nic"]}, config=FAST))
            raw = await register(service.ws_url, v1("vm", ["nic"], instance="raw"))
            async with consuming(view):
                await view.wait_for(lambda: view.counts["BootstrapDone"] == 1)
                old = service.hub.epoch
                server.kill()
                (directory / "dump.rdb").unlink(missing_ok=True)
                server.start()
                assert await _until_closed(raw) == ([], 4009, RECREATED)
                await view.wait_for(lambda: view.counts["BootstrapDone"] == 2)
                assert view.counts["Resync"] == 1 and view.objects["vm"] == {}
                async with bucket_of(service.config) as bucket:  # the service's lost its link
                    fresh = await bucket.commit("vm", "fresh", ["nic"], vm("fresh"))
                await view.wait_for(lambda: view.cursor == fresh)
            assert service.hub.epoch != old and service.tail.faults.epoch_changes == 1
            again = await register(service.ws_url, v1("vm", ["nic"], since=cursors[-1]))
            assert again.reply["resumed"] is False
            await again.close()
    finally:
        server.stop()


async def test_an_unexpected_error_of_a_read_does_not_end_the_tail(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failpoint: the tail's next read raises what is not a Redis error (uvloop's
    RuntimeError for a connection closed under its handshake, as the nemesis met it). The tail
    says so with a traceback, counts it, backs off and reads on; before, its task ended and the
    publisher went on answering /readyz 200 while its listeners were sent nothing more."""
    async with start_publisher(make_config(redis_server.url)) as service:
        with capture_logs() as logs:
            failpoint = FailOnce(monkeypatch, Shard, "tail", RuntimeError(
                "unable to perform operation on <TCPTransport closed=True>"))
            first = await service.bucket.commit("vm", "vm-1", ["nic"], {"n": 1})
            await eventually(lambda: failpoint.fired, "the failpoint fired")
            second = await service.bucket.commit("vm", "vm-2", ["nic"], {"n": 2})
            position = Position.decode(second).position
            assert position > Position.decode(first).position
            await eventually(lambda: service.hub.vector.positions[0] >= position,
                             "the tail read past both commits", within=10)
        assert service.tail.faults.unexpected == 1
        assert service.tail.healthy
        assert any(e["event"].startswith("tail: unexpected error") and e.get("exc_info")
                   for e in logs), logs


async def test_a_redis_that_fails_while_the_tail_takes_up_a_new_history_is_retried(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis comes back empty, and fails again (a failpoint) while the tail takes up the new
    history: the tail backs off and takes it up again. Before, the failure was raised in the
    tail's handler of the new history and ended the tail task."""
    async with start_publisher(make_config(redis_server.url)) as service:
        old = service.hub.epoch
        failpoint = FailOnce(monkeypatch, Log, "ensure",
                             BucketUnavailable("epoch: Redis unreachable (a failpoint)"))
        async with aioredis.from_url(redis_server.url) as client:
            await client.flushall()  # Redis came back empty: a new history
        await eventually(lambda: failpoint.fired, "the failpoint fired", within=10)
        await eventually(lambda: service.hub.epoch != old and service.tail.healthy,
                         "the tail took up the new history", within=10)
        cursor = await service.bucket.commit("vm", "vm-1", ["nic"], {"n": 1})
        position = Position.decode(cursor).position
        await eventually(lambda: service.hub.vector.positions[0] >= position,
                         "the tail read the commit", within=10)
        assert service.tail.faults.unexpected == 0
