"""The writer's witness: a client remembers the changes it was acknowledged (one per connection,
until a later commit had them checked), so a Redis that lost acknowledged commits (restored from
an older snapshot, the other side of a split brain) is noticed by the next commit even when no
publisher read them: the bucket gets a new epoch and every listener bootstraps."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import redis
from structlog.testing import capture_logs

from changefeed.cursor import Position
from changefeed.errors import CommitOutcomeUnknown
from changefeed_testing.proxy import Proxy
from publisher.bucket import Change, ChangeBucket, connect
from tests.servers import RedisServer


def _snapshot(server: RedisServer) -> Path:
    with redis.Redis.from_url(server.url) as client:
        client.save()
    kept = server.directory / "snapshot.rdb"
    shutil.copy(server.directory / "dump.rdb", kept)
    return kept


async def test_a_commit_after_a_rollback_starts_a_new_epoch(tmp_path: Path) -> None:
    server = RedisServer(tmp_path, tcp=True, persist=False).start()
    try:
        bucket = ChangeBucket(connect(server.url), "test")
        first = await bucket.commit_many([Change.publish("vm", f"a{i}", ["nic"]) for i in range(5)])
        snapshot = await asyncio.to_thread(_snapshot, server)
        lost = await bucket.commit_many([Change.publish("vm", f"b{i}", ["nic"]) for i in range(5)])
        await bucket.aclose()

        server.kill()
        shutil.copy(snapshot, server.directory / "dump.rdb")
        await asyncio.to_thread(server.start)

        bucket.redis = connect(server.url)  # the same client's memory, a new connection
        restored = await bucket.log.retention()
        assert restored.epoch == Position.decode(first[0]).epoch, "the snapshot's epoch came back"
        assert restored.head == Position.decode(first[-1]).position
        assert restored.head < Position.decode(lost[-1]).position

        with capture_logs() as logs:
            after = await bucket.commit("vm", "c", ["nic"], {"n": 1})
        assert Position.decode(after).epoch != restored.epoch, "a new history: a new epoch"
        assert (await bucket.log.retention()).epoch == Position.decode(after).epoch
        assert [e["log_level"] for e in logs if "rolled back" in e["event"]] == ["error"]

        with capture_logs() as logs:
            again = await bucket.commit("vm", "d", ["nic"], {"n": 2})
        assert Position.decode(again).epoch == Position.decode(after).epoch, "renewed once"
        assert not [e for e in logs if "rolled back" in e["event"]]

        # A client that never committed before has no witness: nothing to compare, nothing
        # renewed.
        other = ChangeBucket(connect(server.url), "test")
        assert Position.decode(await other.publish("vm", "e", ["nic"])).epoch == Position.decode(
            after
        ).epoch
        await other.aclose()
        await bucket.aclose()
    finally:
        server.stop()



async def _retried(bucket: ChangeBucket, id: str) -> str:
    """Commit under a key, again once when the first try's connection was reset (the proxy
    aborted it when it switched servers)."""
    try:
        return await bucket.commit("vm", id, ["nic"], {"n": 2}, key=f"{id}-2")
    except CommitOutcomeUnknown:
        return await bucket.commit("vm", id, ["nic"], {"n": 2}, key=f"{id}-2")


async def test_a_commit_with_a_witness_of_a_history_this_bucket_never_held_starts_a_new_epoch(
    tmp_path: Path,
) -> None:
    """A split brain, found by the nemesis (faults/nemesis, seed 1): writers were
    acknowledged commits by a master that has since been demoted (its history, under an epoch of
    its own, thrown away by its resync), and their address now leads to the master that won.
    The witness is of an epoch the winner never held, so comparing heads cannot see the loss:
    those commits are gone and no listener was told. The bucket must get a new epoch (once,
    whichever writer comes first), so that every publisher closes its listeners with 4009."""
    lost_side = RedisServer(tmp_path / "lost", tcp=True, persist=False).start()
    winner = RedisServer(tmp_path / "winner", tcp=True, persist=False).start()
    try:
        async with Proxy("127.0.0.1", lost_side.port) as proxy:
            url = f"redis://127.0.0.1:{proxy.port}/0"
            writer, other = ChangeBucket(connect(url), "test"), ChangeBucket(connect(url), "test")
            # The winner's history is the older one: it went on while the lost side took writes.
            survivor = ChangeBucket(connect(winner.url), "test")
            kept = await survivor.commit("vm", "c", ["nic"], {"n": 1})
            await asyncio.sleep(0.01)  # the lost side's commits come after, by Redis's ms
            lost = await writer.commit("vm", "a", ["nic"], {"n": 1})
            await other.commit("vm", "b", ["nic"], {"n": 1})
            assert Position.decode(kept).epoch != Position.decode(lost).epoch

            proxy.retarget("127.0.0.1", winner.port)  # the writers' address: the winner now
            lost_side.kill()
            with capture_logs() as logs:
                after = await _retried(writer, "a")
            renewed = Position.decode(after).epoch
            assert renewed not in (Position.decode(kept).epoch, Position.decode(lost).epoch)
            assert (await survivor.log.retention()).epoch == renewed
            assert [e["log_level"] for e in logs if "rolled back" in e["event"]] == ["error"]

            # Another writer of the lost history: the loss is announced already, not again.
            assert Position.decode(await _retried(other, "b")).epoch == renewed
            # The survivor's witness is of the epoch the bucket renewed from: its own history.
            again = await survivor.commit("vm", "c", ["nic"], {"n": 2})
            assert Position.decode(again).epoch == renewed
            for bucket in (writer, other, survivor):
                await bucket.aclose()
    finally:
        lost_side.stop()
        winner.stop()


async def test_a_witness_of_an_epoch_past_where_this_history_left_it_starts_a_new_epoch(
    tmp_path: Path,
) -> None:
    """A split brain whose two sides shared the epoch, found by the nemesis (seed 5079): a
    publisher on one side saw a rollback and renewed the epoch there, while the other side, a
    master of its own until demoted, went on acknowledging commits in the old epoch. The
    writer's witness is then of an epoch the winner descends from, so it was taken for one of
    the winner's own: those commits were lost and no listener was told. The winner lacks the
    witnessed change: the bucket must get a new epoch."""
    winner = RedisServer(tmp_path / "winner", tcp=True, persist=False).start()
    other_side = RedisServer(tmp_path / "other", tcp=True, persist=False)
    try:
        async with Proxy("127.0.0.1", winner.port) as proxy:
            writer = ChangeBucket(connect(f"redis://127.0.0.1:{proxy.port}/0"), "test")
            shared = Position.decode(await writer.commit("vm", "a", ["nic"], {"n": 1})).epoch
            snapshot = await asyncio.to_thread(_snapshot, winner)
            other_side.directory.mkdir(parents=True, exist_ok=True)
            shutil.copy(snapshot, other_side.directory / "dump.rdb")
            await asyncio.to_thread(other_side.start)  # the same history, a master of its own

            survivor = ChangeBucket(connect(winner.url), "test")
            renewed = await survivor.log.renew_epoch(shared)  # a publisher there saw a rollback
            assert renewed != shared
            await asyncio.sleep(0.01)  # the other side's commit comes after, by Redis's ms
            proxy.retarget("127.0.0.1", other_side.port)
            lost = await _retried(writer, "b")
            assert Position.decode(lost).epoch == shared, "the other side went on in the old epoch"

            proxy.retarget("127.0.0.1", winner.port)  # the writer's address: the winner now
            other_side.kill()
            with capture_logs() as logs:
                after = await _retried(writer, "c")
            assert Position.decode(after).epoch not in (shared, renewed), "the loss is announced"
            assert (await survivor.log.retention()).epoch == Position.decode(after).epoch
            assert [e["log_level"] for e in logs if "rolled back" in e["event"]] == ["error"]
            # A witness of the old epoch at or before where the winner left it is its own.
            assert Position.decode(await survivor.commit("vm", "d", ["nic"], {"n": 1})).epoch == (
                Position.decode(after).epoch)
            for bucket in (writer, survivor):
                await bucket.aclose()
    finally:
        other_side.stop()
        winner.stop()


def _split(winner: RedisServer, other_side: RedisServer) -> None:
    """Start `other_side` from a snapshot of `winner`: the same history and epoch, a master of
    its own (a split brain's two sides)."""
    snapshot = _snapshot(winner)
    other_side.directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(snapshot, other_side.directory / "dump.rdb")
    other_side.start()


@dataclass
class SplitBrain:
    """The two sides of a split brain, sharing one history and epoch (`shared`), and a writer
    that reaches them through `proxy` (leading to the winner at first)."""

    winner: RedisServer
    other_side: RedisServer
    proxy: Proxy
    writer: ChangeBucket
    shared: str


@contextlib.asynccontextmanager
async def split_brain(tmp_path: Path) -> AsyncIterator[SplitBrain]:
    """The writer commits once on the winner, then the other side starts from its snapshot."""
    winner = RedisServer(tmp_path / "winner", tcp=True, persist=False).start()
    other_side = RedisServer(tmp_path / "other", tcp=True, persist=False)
    try:
        async with Proxy("127.0.0.1", winner.port) as proxy:
            writer = ChangeBucket(connect(f"redis://127.0.0.1:{proxy.port}/0"), "test")
            try:
                shared = Position.decode(await writer.commit("vm", "a", ["nic"], {"n": 1})).epoch
                await asyncio.to_thread(_split, winner, other_side)
                yield SplitBrain(winner, other_side, proxy, writer, shared)
            finally:
                await writer.aclose()
    finally:
        other_side.stop()
        winner.stop()


async def test_a_witness_the_winner_lacks_starts_a_new_epoch_whatever_its_epoch_and_head(
    tmp_path: Path,
) -> None:
    """The sides of a split brain share the epoch and both go on: the writer's witness is of that
    epoch and, by position, behind the winner's head (others committed there since), so neither
    the epoch nor the head tells the loss (the nemesis, seed 5079, after the fix above: 2 changes
    lost). The winner lacks the change itself: the bucket must get a new epoch."""
    async with split_brain(tmp_path) as brain:
        writer, shared = brain.writer, brain.shared
        brain.proxy.retarget("127.0.0.1", brain.other_side.port)
        lost = Position.decode(await _retried(writer, "b"))
        assert lost.epoch == shared

        survivor = ChangeBucket(connect(brain.winner.url), "test")
        await asyncio.sleep(0.01)
        ahead = Position.decode(await survivor.commit("vm", "c", ["nic"], {"n": 1}))
        assert ahead.epoch == shared and lost.position < ahead.position

        brain.proxy.retarget("127.0.0.1", brain.winner.port)
        brain.other_side.kill()
        with capture_logs() as logs:
            after = Position.decode(await _retried(writer, "d"))
        assert after.epoch != shared, "the loss is announced"
        assert (await survivor.log.retention()).epoch == after.epoch
        assert [e["log_level"] for e in logs if "rolled back" in e["event"]] == ["error"]
        # The survivor's witness is in the winner's history: no third epoch.
        assert Position.decode(await survivor.commit("vm", "e", ["nic"], {})).epoch == after.epoch
        await survivor.aclose()


async def test_a_client_acknowledged_by_both_sides_at_once_keeps_a_witness_of_each(
    tmp_path: Path,
) -> None:
    """One client, two connections (its kept one and a pooled one, for a commit made while the
    kept one is busy) that lead to the two sides of a split brain: both commits are
    acknowledged, and the newest by position is the winner's. A client that kept one witness
    (the newest) would never show the winner the other side's commit; with one per connection,
    its next commit does."""
    async with split_brain(tmp_path) as brain:
        writer, winner = brain.writer, brain.winner
        # The kept connection still reaches the winner; a new one reaches the other side.
        brain.proxy.retarget("127.0.0.1", brain.other_side.port, keep_open=True)
        winner.pause()
        kept = asyncio.ensure_future(writer.commit("vm", "x", ["nic"], {"n": 1}))
        await asyncio.sleep(0.05)  # x waits on the kept connection: y takes a new one
        lost = Position.decode(await writer.commit("vm", "y", ["nic"], {"n": 1}))
        await asyncio.sleep(0.01)
        winner.resume()
        newest = Position.decode(await kept)
        assert lost.epoch == newest.epoch == brain.shared and lost.position < newest.position

        brain.proxy.retarget("127.0.0.1", winner.port)
        brain.other_side.kill()
        with capture_logs() as logs:
            after = Position.decode(await _retried(writer, "z"))
        assert after.epoch != brain.shared, "the other side's commit is missed and announced"
        assert [e["log_level"] for e in logs if "rolled back" in e["event"]] == ["error"]


async def test_a_witness_of_a_history_lost_before_this_one_began_starts_no_new_epoch(
    redis_server: RedisServer,
) -> None:
    """Redis came back empty and the bucket was created again (a tail's ensure, or another
    writer's commit): every publisher closed the old epoch's listeners when it saw it gone, and
    every listener of the new one started after the loss. A writer's witness of the old epoch is
    no split brain: its next commit goes into the new history, not a third one."""
    writer = ChangeBucket(connect(redis_server.url), "test")
    other = ChangeBucket(connect(redis_server.url), "test")
    try:
        before = Position.decode(await writer.commit("vm", "a", ["nic"], {"n": 1})).epoch
        await writer.redis.flushall()
        await asyncio.sleep(0.01)
        recreated = Position.decode(await other.commit("vm", "b", ["nic"], {"n": 1})).epoch
        assert recreated != before
        with capture_logs() as logs:
            after = Position.decode(await writer.commit("vm", "a", ["nic"], {"n": 2})).epoch
        assert after == recreated
        assert not [e for e in logs if "rolled back" in e["event"]]
    finally:
        await writer.aclose()
        await other.aclose()
