"""A tiny listener application for the kit's tests: a mirror of one resource, kept from a
`listener.Listener` the way docs/listener.md tells services to, recording what it was given."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

from changefeed.errors import ChangefeedError
from changefeed_testing import scaled
from listener import (
    Backoff,
    BootstrapDone,
    BootstrapRecords,
    BootstrapStart,
    Change,
    Event,
    FetchFailed,
    Listener,
    ListenerConfig,
    Resync,
)

QUICK = ListenerConfig(backoff=Backoff(initial=0.02, maximum=0.2), open_timeout=1.0,
                       heartbeat_interval=None)
"""Reconnects within a fraction of a second; gives up on a registration after 1 s."""


class Mirror:
    """id -> object of `resource`, from bootstrap pages and changes (each fetched again)."""

    def __init__(self, url: str, resource: str = "vm", since: str | None = None,
                 config: ListenerConfig = QUICK) -> None:
        self.feed = Listener(url, instance="kit-test", service="kit-test",
                             resources={resource: ["*"]}, since=since, config=config)
        self.objects: dict[str, Any] = {}
        self.events: Counter[str] = Counter()
        self.errors: list[ChangefeedError] = []
        self.cursor: str | None = None
        self._fresh: dict[str, Any] = {}
        self._updated = asyncio.Condition()

    async def apply(self, event: Event) -> None:
        self.events[type(event).__name__] += 1
        match event:
            case Resync():
                self.objects.clear()
            case BootstrapStart():
                self._fresh = {}
            case BootstrapRecords(_, objects):
                self._fresh.update((obj["uuid"], obj) for obj in objects)
            case BootstrapDone(_, cursor):
                self.objects, self.cursor = self._fresh, cursor or self.cursor
            case Change(item):
                obj = await self.fetch(item.resource, item.changed_resource_id)
                if obj is None:
                    self.objects.pop(item.changed_resource_id, None)
                else:
                    self.objects[item.changed_resource_id] = obj
                self.cursor = item.cursor
        async with self._updated:
            self._updated.notify_all()

    async def fetch(self, resource: str, id: str) -> Any:
        """The object, or None when it is gone; retried while the publisher does not answer
        (it may be restarting under a fault)."""
        delay = 0.02
        while True:
            try:
                return await self.feed.fetch(resource, id)
            except FetchFailed as error:
                if error.status is not None and error.status < 500:
                    raise
                self.errors.append(error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    async def failed(self, error: ChangefeedError) -> None:
        self.errors.append(error)
        async with self._updated:
            self._updated.notify_all()

    async def until(self, predicate: Callable[[], bool], within: float = 20) -> None:
        """Wait until `predicate()` holds after some event (scaled timeout)."""
        async with asyncio.timeout(scaled(within)), self._updated:
            await self._updated.wait_for(predicate)


@contextlib.asynccontextmanager
async def running(mirror: Mirror) -> AsyncIterator[Mirror]:
    """Run the mirror's listener in a task for the block."""
    async with mirror.feed:
        task = asyncio.create_task(
            mirror.feed.run(on_bootstrap=mirror.apply, on_change=mirror.apply,
                            on_error=mirror.failed)
        )
        try:
            yield mirror
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
