"""An `events` reader across a new epoch begun by a Sentinel failover that lost a write.

Issue 30 (a run from outside the project): the killed master had taken a write the replica
never got, the promoted replica's bucket began a new epoch, and a pull consumer resuming from its
old-epoch cursor took all 400 items of its resource again: the reply said `missed` (a cursor of
another epoch) and the consumer could only start over from the oldest. A reader whose position's
entry is in the new history has lost nothing: it is told where its position stands in the new
epoch (`resume_after`) and goes on from there; one that was given the lost write is told that
entries it was given were rolled back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
import redis

from changefeed.cursor import Position
from changefeed.errors import BucketUnavailable, CommitOutcomeUnknown
from changefeed_testing.proxy import Proxy
from listener import ItemsMissed, PullConsumer
from publisher.config.settings import Config
from tests.conftest import PublisherFactory
from tests.publisher.bucket.redis.test_sentinel_pool import trio
from tests.servers import eventually

ITEMS = 400


async def _events(url: str, after: str) -> dict[str, object]:
    async with aiohttp.ClientSession() as http, http.get(
        url + "/changefeeds/events", params={"resource": "vm", "after": after, "wait_time": "0"}
    ) as reply:
        assert reply.status == 200
        body: dict[str, object] = await reply.json()
        return body


async def test_a_reader_resuming_from_an_old_epoch_cursor_is_told_where_it_stands(
    tmp_path: Path, make_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    async with trio(tmp_path) as servers, Proxy("127.0.0.1", servers.master.port) as link, \
            start_publisher(make_config(servers.url)) as service:
        bucket = service.bucket
        for n in range(ITEMS):
            await bucket.publish("vm", f"vm{n}", ["nic"])
        with redis.Redis(host="127.0.0.1", port=servers.master.port) as master:
            assert master.execute_command("WAIT", 1, 10_000) == 1  # the replica has them all
        old = await bucket.log.current_epoch()
        async with PullConsumer(service.url, resource="vm") as reader:
            got = await reader.fetch(ITEMS, expires=5)
            assert len(got) == ITEMS
            kept = reader.cursor
        assert kept is not None

        # The replica follows the master through a link that carries nothing (a replica whose
        # link stalled: still a replica, the sentinels' choice): the next write reaches the
        # master only.
        link.blackhole()
        with redis.Redis(host="127.0.0.1", port=servers.replica.port) as replica:
            replica.replicaof("127.0.0.1", link.port)
        lost = await bucket.publish("vm", "lost", ["nic"], key="lost-write")
        await eventually(lambda: service.hub.position(0) >= Position.decode(lost).position,
                         "the publisher's tail read the write the replica lacks")
        servers.master.kill()
        await servers.fail_over(everywhere=True)
        with redis.Redis(host="127.0.0.1", port=servers.replica.port) as promoted:
            at = str(Position.decode(lost).position)
            assert not promoted.xrange("{test}:log", at, at), "the write was lost"
        # The tail's position is gone from the promoted replica: it begins a new epoch.
        new = old
        while new == old:
            with contextlib.suppress(BucketUnavailable):
                new = await bucket.log.current_epoch()
        retried = None
        while retried is None:  # the writer's retry of the write whose answer it never had
            with contextlib.suppress(BucketUnavailable, CommitOutcomeUnknown):
                retried = await bucket.publish("vm", "lost", ["nic"], key="lost-write")
        assert Position.decode(retried).epoch == new

        told = await _events(service.url, kept)
        assert told["items"] == [] and told["missed"] is True, told
        position = Position.decode(kept).position
        assert told["resume_after"] == Position.single(str(new), position).encode(), told

        async with PullConsumer(service.url, resource="vm", after=kept) as reader:
            again = await reader.fetch(ITEMS + 1, expires=5)
        assert [item.changed_resource_id for item in again] == ["lost"], (
            f"{len(again)} items: the reader took the old epoch's items again")
        assert again[0].cursor == retried

        given_the_lost_write = await _events(service.url, lost)
        assert given_the_lost_write["missed"] is True
        assert "resume_after" not in given_the_lost_write
        assert "rolled back" in str(given_the_lost_write["missed_reason"])
        async with PullConsumer(service.url, resource="vm", after=lost) as reader:
            with pytest.raises(ItemsMissed, match="rolled back"):
                await reader.fetch(10, expires=5)
