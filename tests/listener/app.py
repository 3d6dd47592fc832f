"""A small application for the listener tests: it keeps a local view the way docs/listener.md
tells services to, and records what it was given, so tests can wait on it and compare."""

from __future__ import annotations

import asyncio
import contextlib
import re
import types
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson

from listener import (
    BootstrapDone,
    BootstrapRecords,
    BootstrapStart,
    Change,
    ChangeItem,
    Event,
    Listener,
    MemoryBuffer,
    Resync,
)
from publisher.bucket import ChangeBucket, connect
from publisher.config.settings import Config
from tests.servers import PublisherProcess, scaled

DOCS = Path(__file__).parents[2] / "docs"


def vm(id: str, **fields: object) -> dict[str, object]:
    """A stored VM object as the tests commit it."""
    return {"uuid": id, **fields}


class View:
    """id -> object per resource, kept correct from a listener's events."""

    def __init__(self, feed: Listener) -> None:
        self.feed = feed
        self.objects: dict[str, dict[str, Any]] = {}
        self.counts: Counter[str] = Counter()
        self.changes: list[ChangeItem] = []
        self.errors: list[BaseException] = []
        self._fresh: dict[str, dict[str, Any]] = {}
        self._updated = asyncio.Condition()

    async def apply(self, event: Event) -> None:
        self.counts[type(event).__name__] += 1
        match event:
            case Resync():
                self.objects.clear()
            case BootstrapStart(resource):
                self._fresh[resource] = {}
            case BootstrapRecords(resource, objects):
                for obj in objects:
                    self._fresh[resource][obj["uuid"]] = obj
            case BootstrapDone(resource):
                self.objects[resource] = self._fresh.pop(resource)
            case Change(item):
                obj = await self.feed.fetch(item.resource, item.changed_resource_id)
                if obj is None:
                    self.objects.setdefault(item.resource, {}).pop(item.changed_resource_id, None)
                else:
                    self.objects.setdefault(item.resource, {})[item.changed_resource_id] = obj
                self.changes.append(item)
        async with self._updated:
            self._updated.notify_all()

    @property
    def cursor(self) -> str | None:
        """The cursor of the last change applied."""
        return self.changes[-1].cursor if self.changes else None

    async def consume(self) -> None:
        async for event in self.feed:
            await self.apply(event)

    async def wait_for(self, predicate: Callable[[], bool], within: float = 20) -> None:
        async with asyncio.timeout(scaled(within)), self._updated:
            await self._updated.wait_for(predicate)


@contextlib.asynccontextmanager
async def consuming(view: View) -> AsyncIterator[asyncio.Task[None]]:
    """Run the view's consumer; on exit, close the feed and re-raise what the consumer raised."""
    task = asyncio.create_task(view.consume())
    try:
        yield task
    finally:
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await view.feed.aclose()


class WatchedBuffer(MemoryBuffer):
    """A memory buffer that says when it first holds more than `limit` items."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.overflowed = asyncio.Event()

    async def push(self, item: ChangeItem) -> int:
        length = await super().push(item)
        if length > self.limit:
            self.overflowed.set()
        return length


async def store_objects(bucket: ChangeBucket, resource: str) -> dict[str, Any]:
    """Everything the publisher's store holds for `resource`, as the bootstrap route serves it."""
    objects: dict[str, Any] = {}
    after: str | None = None
    while True:
        page = await bucket.page(resource, after, 1000)
        for id, state in zip(page.ids, page.states, strict=True):
            objects[id] = orjson.loads(state)
        if len(page.ids) < 1000:
            return objects
        after = page.ids[-1]


@contextlib.asynccontextmanager
async def bucket_of(config: Config) -> AsyncIterator[ChangeBucket]:
    assert config.bucket.redis_url is not None
    bucket = ChangeBucket(connect(config.bucket.redis_url), config.bucket.name, config.resources)
    try:
        yield bucket
    finally:
        await bucket.aclose()


@contextlib.asynccontextmanager
async def publisher_process(path: Path) -> AsyncIterator[PublisherProcess]:
    process = PublisherProcess(path)
    await asyncio.to_thread(process.start)
    try:
        yield process
    finally:
        process.stop()


def doc_example(name: str, doc: str = "listener.md") -> types.ModuleType:
    """The example marked `<!-- example: name -->` in docs/<doc>, as a module (the docs' code
    is what the tests run)."""
    path = DOCS / doc
    match = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```", path.read_text(), re.S)
    assert match, f"docs/{doc} lost its {name} example"
    module = types.ModuleType(name)
    exec(compile(match.group(1), str(path), "exec"), module.__dict__)
    return module
