"""Faults to inject into a real publisher and its Redis while a listener under test runs.

    await faults.restart_publisher()           # SIGTERM (1001) and start again on the same URL
    await faults.restart_publisher(kill=True)  # SIGKILL: the listener sees 1006
    await faults.pause_redis(2.0)              # SIGSTOP redis-server for 2 s, then SIGCONT
    with faults.redis_paused(): ...            # paused for the block
    await faults.trim_past(cursor)             # the log no longer reaches back to `cursor`
    async with faults.slow_socket(2000) as slow: Listener(slow.url, ...)

Every fault acts on the real processes: nothing is mocked. What a listener sees after each is
in docs/testing.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from urllib.parse import urlsplit

from changefeed_testing.proxy import SlowSocket
from changefeed_testing.running import RunningPublisher
from changefeed_testing.servers import RedisServer

TRIM_ATTEMPTS = 200
"""trim_past retries its trim this often (each a millisecond apart) before it gives up."""


class Faults:
    """The fault helpers of one publisher and its Redis (the `changefeed_faults` fixture)."""

    def __init__(self, redis: RedisServer, publisher: RunningPublisher) -> None:
        self.redis = redis
        self.publisher = publisher

    async def restart_publisher(self, *, kill: bool = False) -> None:
        """Stop the publisher and start it again on the same URL and bucket; returns once it
        listens again. Listeners are closed with 1001 (`kill=False`, SIGTERM) or see the
        connection drop (`kill=True`, SIGKILL: 1006); both resume with `since`."""
        await asyncio.to_thread(self.publisher.process.restart, kill=kill)

    @contextlib.contextmanager
    def redis_paused(self) -> Iterator[None]:
        """SIGSTOP the redis-server for the duration of the block (SIGCONT on exit, also on an
        error). Its clients keep their connections; every command waits."""
        self.redis.pause()
        try:
            yield
        finally:
            self.redis.resume()

    async def pause_redis(self, seconds: float) -> None:
        """Pause the redis-server for `seconds` (not scaled), then resume it."""
        with self.redis_paused():
            await asyncio.sleep(seconds)  # the length of the fault itself

    async def trim_past(self, cursor: str) -> int:
        """Trim the bucket's log up to its newest item, so that `cursor` lies before the
        retained log: a listener registering with `since=cursor` is answered `resumed: false`
        and must bootstrap (the listener library yields `Resync`). Returns the items removed.

        Raises ValueError when the log holds nothing after `cursor` (the cursor is the head:
        it stays resumable however much is trimmed) or `cursor` is of another bucket epoch.
        """
        from changefeed.cursor import Position

        mark = Position.decode_single(cursor)
        removed = 0
        async with self.publisher.bucket() as bucket:
            retention = await bucket.log.retention()
            if retention.epoch != mark.epoch:
                raise ValueError(f"cursor {cursor} is not of this bucket (epoch {retention.epoch})")
            if retention.head <= mark.position:
                raise ValueError(
                    f"nothing after {cursor} to trim: commit a change after it first "
                    "(a listener at the head of the log can always resume)"
                )
            for _ in range(TRIM_ATTEMPTS):
                # maxAge 1 ms: everything committed before the last millisecond goes.
                removed += await bucket.log.trim(0.001)
                if (await bucket.log.retention()).trimmed >= retention.head:
                    return removed
                await asyncio.sleep(0.001)  # Redis' clock must pass the head's millisecond
        raise AssertionError(f"the log was not trimmed past {cursor}")

    def slow_socket(self, bytes_per_second: int | None = 2000) -> SlowSocket:
        """A TCP proxy in front of the publisher that lets `bytes_per_second` through each way:
        `async with faults.slow_socket(2000) as slow:` and give the listener `slow.url`.
        `slow.rate = None` lifts the limit."""
        parts = urlsplit(self.publisher.url)
        assert parts.hostname is not None and parts.port is not None
        return SlowSocket(parts.hostname, parts.port, bytes_per_second)

