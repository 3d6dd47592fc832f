"""The example service of docs/listener.md, run as written against a real publisher."""

from __future__ import annotations

import asyncio
import contextlib
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from publisher.bucket import Change
from publisher.config.settings import Config
from tests.conftest import PublisherFactory
from tests.listener.app import doc_example, store_objects
from tests.records import logged
from tests.servers import RedisServer, free_port, scaled


def example_module() -> types.ModuleType:
    return doc_example("vmcache")


class Watched:
    """Runs a VmCache and lets the test wait until its saved state satisfies a predicate."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.saved = asyncio.Event()
        save = cache.save

        def save_and_signal() -> None:
            save()
            self.saved.set()

        cache.save = save_and_signal

    async def until(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(scaled(20)):
            while not predicate():
                self.saved.clear()
                await self.saved.wait()


@contextlib.asynccontextmanager
async def running(cache: Any) -> Any:
    task = asyncio.create_task(cache.run())
    try:
        yield Watched(cache)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_vm_cache_stays_exact_through_restarts(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory, tmp_path: Path,
) -> None:
    vmcache = example_module()
    config = make_config(redis_server.url, server={"host": "127.0.0.1", "port": free_port()})
    url = f"http://127.0.0.1:{config.server.port}"
    listener_config = tmp_path / "service.js"
    listener_config.write_text("module.exports = {changefeed: {backoff: {initial: 0.02, "
                               "maximum: 0.1}, pageSize: 40}, other: 1};")
    state = tmp_path / "vmcache.json"
    async with start_publisher(config) as publisher:
        bucket = publisher.bucket
        await bucket.commit_many([Change.put("vm", f"vm-{n:03}", ["nic"], {"uuid": f"vm-{n:03}"})
                                  for n in range(150)])
        cache = vmcache.VmCache([url], state, listener_config)
        async with running(cache) as watched:
            await watched.until(lambda: len(cache.vms) == 150)
            last = await bucket.commit("vm", "vm-000", ["alias"], {"uuid": "vm-000", "a": 1})
            await watched.until(lambda: cache.cursor == last)

        # The service is down; changes go on; then the publisher restarts too.
        await bucket.commit("vm", "vm-001", ["nic"], None, delete=True)
        last = await bucket.commit("vm", "vm-new", ["nic"], {"uuid": "vm-new"})
    async with start_publisher(config) as publisher:
        with logged() as logs:
            cache = vmcache.VmCache([url], state, listener_config)
            assert len(cache.vms) == 150  # loaded from its file
            async with running(cache) as watched:
                await watched.until(lambda: cache.cursor == last)
        assert cache.vms == await store_objects(publisher.bucket, "vm")
        registered = [entry for entry in logs if entry["event"] == "registered"]
        assert [entry["resumed"] for entry in registered] == [True]  # no bootstrap
