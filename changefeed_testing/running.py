"""A publisher subprocess with what a test needs to know about it: the kit's unit of set-up.

    redis = RedisServer(directory / "redis", persist=False).start()
    publisher = RunningPublisher.start(directory, redis.url, {"maxAge": 60})
    ...  # publisher.url for listeners; `async with publisher.bucket() as bucket:` to commit
    publisher.stop(); redis.stop()

The pytest plugin (changefeed_testing.plugin) wraps exactly this in fixtures; other test runners
can call it directly.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from changefeed_testing.servers import PublisherProcess, write_config

if TYPE_CHECKING:
    from publisher import ChangeBucket, Config


@dataclass
class RunningPublisher:
    """`changefeed serve` running in a subprocess on a given Redis.

    Its port stays the same across restarts, so that the listeners under test find it again.
    """

    process: PublisherProcess
    config_path: Path
    """The config.js the publisher runs on (the kit's defaults merged with the settings)."""
    redis_url: str
    """Where its change bucket lives."""

    @classmethod
    def start(
        cls, directory: Path, redis_url: str, settings: Mapping[str, Any] | None = None
    ) -> RunningPublisher:
        """Write a config.js in `directory` (resources `vm` and `network` unless `settings`
        names others; any config.js key of `settings` wins, `bucket.name` and
        `bucket.partitions` too) and start a publisher on it.

        It binds port 0 (no race for a free port); the config is then rewritten with the port
        it got, so that a restart comes back on the same URL."""
        extra = dict(settings or {})
        bucket = dict(extra.pop("bucket", None) or {})
        if "server" in extra or "redisUrl" in bucket:
            raise ValueError("changefeed settings: `server` and `bucket.redisUrl` are the kit's "
                             "(a private Redis, a port of the publisher's own)")
        extra["bucket"] = {"redisUrl": redis_url, "name": "test", **bucket}
        extra["server"] = {"host": "127.0.0.1", "port": 0}
        directory.mkdir(parents=True, exist_ok=True)
        path = write_config(directory / "config.js", redis_url, **extra)
        process = PublisherProcess(path).start()
        port = urlsplit(process.url).port
        assert port is not None, process.url
        write_config(path, redis_url, **{**extra, "server": {"host": "127.0.0.1", "port": port}})
        return cls(process, path, redis_url)

    @property
    def url(self) -> str:
        """The publisher's base URL, `http://127.0.0.1:<port>`: what a Listener is given."""
        return self.process.url

    @property
    def ws_url(self) -> str:
        """The websocket URL, `ws://127.0.0.1:<port>/changefeeds`."""
        return self.process.ws_url

    @property
    def config(self) -> Config:
        """The config.js as the publisher parsed it (resources, limits, bucket name...)."""
        from publisher import load_config

        return load_config(self.config_path)

    @contextlib.asynccontextmanager
    async def bucket(self) -> AsyncIterator[ChangeBucket]:
        """A `ChangeBucket` on the publisher's bucket, to commit changes from a test; closed on
        exit."""
        from publisher import ChangeBucket, connect

        config = self.config
        bucket = ChangeBucket(
            connect(self.redis_url), config.bucket.name, config.resources, config.bucket.partitions
        )
        try:
            yield bucket
        finally:
            await bucket.aclose()

    def output(self) -> str:
        """Everything the publisher logged (JSON lines), for a failing test's message."""
        return self.process.output()

    def stop(self) -> None:
        self.process.stop()
