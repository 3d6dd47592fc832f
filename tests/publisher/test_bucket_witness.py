"""The writer's witness: a client remembers the newest position it was acknowledged, so a Redis
that lost acknowledged commits (restored from an older snapshot) is noticed by the next commit
even when no publisher read them: the bucket gets a new epoch and every listener bootstraps."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import redis
from structlog.testing import capture_logs

from changefeed.cursor import Cursor
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
        restored = await bucket.retention()
        assert restored.epoch == Cursor.decode(first[0]).epoch, "the snapshot's epoch came back"
        assert restored.head == Cursor.decode(first[-1]).position < Cursor.decode(lost[-1]).position

        with capture_logs() as logs:
            after = await bucket.commit("vm", "c", ["nic"], {"n": 1})
        assert Cursor.decode(after).epoch != restored.epoch, "a new history: a new epoch"
        assert (await bucket.retention()).epoch == Cursor.decode(after).epoch
        assert [e["log_level"] for e in logs if "rolled back" in e["event"]] == ["error"]

        with capture_logs() as logs:
            again = await bucket.commit("vm", "d", ["nic"], {"n": 2})
        assert Cursor.decode(again).epoch == Cursor.decode(after).epoch, "renewed once"
        assert not [e for e in logs if "rolled back" in e["event"]]

        # A client that never committed before has no witness: nothing to compare, nothing
        # renewed.
        other = ChangeBucket(connect(server.url), "test")
        assert Cursor.decode(await other.publish("vm", "e", ["nic"])).epoch == Cursor.decode(
            after
        ).epoch
        await other.aclose()
        await bucket.aclose()
    finally:
        server.stop()
