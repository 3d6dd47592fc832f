"""The nemesis' readers keep what they were delivered across a failed connection: the history
they record is the evidence, so a reader that resumes from the wrong place makes findings that
are its own (faults/nemesis/readers.py)."""

from __future__ import annotations

from collections.abc import Callable

from changefeed_testing.proxy import Proxy
from faults.harness import RESOURCE, SUBS
from faults.nemesis.readers import SseReader
from faults.oracle import History
from publisher.config.settings import Config
from tests.conftest import PublisherFactory
from tests.servers import RedisServer


async def test_the_sse_reader_resumes_from_the_last_event_of_a_stream_that_failed(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    """A stream reset (not ended) must not lose its progress: the reader resumed from where
    that stream began, so the changes committed while it was away were never asked for (here:
    it registered afresh and started at the head), or, after `maxAge`, asked for a trimmed
    cursor and got a Resync that no fault caused (the 30-minute soak)."""
    async with start_publisher(make_config(redis_server.url)) as service:
        port = int(service.url.rpartition(":")[2])
        async with Proxy("127.0.0.1", port) as link:
            history = History()
            log = history.listener("sse")
            reader = SseReader(log, [f"http://127.0.0.1:{link.port}"])
            reader.start()
            try:
                assert await reader.wait(lambda: reader.started.is_set(), 10)
                for n in range(3):
                    await service.bucket.commit(RESOURCE, f"vm-{n}", SUBS, {"n": n})
                assert await reader.wait(lambda: len(log.changes) == 3, 10)

                link.cut(refuse_new=True)  # the stream fails; no new one until it heals
                for n in range(3, 5):
                    await service.bucket.commit(RESOURCE, f"vm-{n}", SUBS, {"n": n})
                link.pass_through()

                assert await reader.wait(lambda: len(log.changes) == 5, 10), log.changes
                assert [c.id for c in log.changes] == [f"vm-{n}" for n in range(5)]
                assert log.resyncs == []
            finally:
                await reader.aclose()
