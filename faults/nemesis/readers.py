"""The nemesis' listeners of the other kinds, each recording what it delivers in a `ListenerLog`
(faults/oracle.py): server-sent events, the `events` pull consumer, a durable consumer
(two instances sharing its work), and the ZeroEventHub feed reader. None bootstraps: a loss they
are told of (`resync`, `missed`, a 410, a dead-letter record of reason `epoch` or `trimmed`) is
recorded as a Resync once the reader has its new starting point, so every acknowledged change
before it counts as announced and every one after it is owed.

The websocket `Listener`s are `faults.harness.Recorder`s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import orjson

from changefeed_testing.servers import scaled
from faults.harness import RESOURCE
from faults.records import Attempt, ListenerLog
from listener import ConsumerRecreated, ItemsMissed, ListenerError, PullConsumer
from listener.durable import DurableConsumer

PAUSE = 0.2
"""Seconds a reader waits before it tries again after a failure (its backoff)."""
EXPIRES = 3.0


class Reader:
    """A reader run in a task; `wait` and `caught_up` as `harness.Recorder`'s."""

    def __init__(self, log: ListenerLog, urls: Sequence[str]) -> None:
        self.log = log
        self.urls = list(urls)
        self.turn = 0
        self.started = asyncio.Event()
        self.failures = 0
        self._updated = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return self.urls[self.turn % len(self.urls)]

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        raise NotImplementedError

    async def failed(self, error: BaseException) -> None:
        """A failure: try the next URL after a pause."""
        self.failures += 1
        self.turn += 1
        await asyncio.sleep(PAUSE)

    async def notify(self) -> None:
        async with self._updated:
            self._updated.notify_all()

    async def wait(self, predicate: Callable[[], bool], within: float) -> bool:
        try:
            async with asyncio.timeout(scaled(within)), self._updated:
                await self._updated.wait_for(predicate)
        except TimeoutError:
            return False
        return True

    async def caught_up(self, attempt: Attempt | None, within: float) -> bool:
        if attempt is None:
            return True
        return await self.wait(lambda: self.log.has(attempt), within)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class SseReader(Reader):
    """`GET /changefeeds/sse?resource=vm&sub=*`, resumed with `Last-Event-ID`."""

    last: str | None = None
    """The id of the last event with one: sent as Last-Event-ID on the next stream. Kept as
    each event arrives, so a stream that fails (a reset, a timeout) loses none of its progress:
    resuming from where it began would ask for changes again (duplicates) or, after `maxAge`,
    for trimmed ones (a Resync no fault caused; the 30-minute soak found it)."""

    async def _run(self) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    await self._stream(session)
                except (aiohttp.ClientError, TimeoutError, ValueError) as error:
                    await self.failed(error)
                else:
                    await self.failed(EOFError("stream ended"))

    async def _stream(self, session: aiohttp.ClientSession) -> None:
        last = self.last
        headers = {"Last-Event-ID": last} if last else {}
        params = {"resource": RESOURCE, "sub": "*", "service": "nemesis",
                  "instance": self.log.name}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=3, sock_read=6)
        async with session.get(self.url + "/changefeeds/sse", params=params, headers=headers,
                               timeout=timeout) as reply:
            if reply.status != 200:
                raise ValueError(f"sse: {reply.status} {await reply.text()}")
            event, data, id = "", "", None
            async for raw in reply.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    data = line[6:]
                elif line.startswith("id: "):
                    id = line[4:]
                elif not line and event:
                    self.last = self._event(event, data, id, self.last)
                    event, data, id = "", "", None
                    await self.notify()

    def _event(self, event: str, data: str, id: str | None, last: str | None) -> str | None:
        now = time.monotonic()
        body = orjson.loads(data) if data else {}
        if event == "registered":
            self.started.set()
            return id or last
        if event == "resync":
            self.log.resync(body.get("reason", "resync"), now)
        elif event == "change":
            self.log.change(body["cursor"], body["changedResourceId"], now)
            last = body["cursor"]
        elif event == "close" and body.get("code") not in (1001, 1013, 4008, 4009, 4029):
            self.log.error(f"sse closed {body}")
        return last


def _moved_epoch(asked: str, items: Sequence[Any], cursor: str) -> bool:
    """Whether a fetch after `asked` went on in another epoch (its items', or its `cursor`)."""
    first = items[0].cursor if items else cursor
    return str(first).partition(".")[0] != asked.partition(".")[0]


class PullReader(Reader):
    """`PullConsumer(url, resource="vm", after=...)`, fetching up to 100 items at a time."""

    async def _run(self) -> None:
        after = await self._newest()
        self.started.set()
        while True:
            consumer = PullConsumer(self.url, resource=RESOURCE, after=after)
            if after is not None:
                self.log.resumed(after, time.monotonic())
            try:
                while True:
                    asked = consumer.cursor
                    items = await consumer.fetch(100, expires=EXPIRES)
                    now = time.monotonic()
                    if asked and consumer.cursor and _moved_epoch(asked, items, consumer.cursor):
                        # Only a reply's resume_after moves a PullConsumer to a new epoch
                        # without ItemsMissed: it was told where its position stands.
                        self.log.told_epoch(asked, now)
                    for item in items:
                        self.log.change(item.cursor, item.changed_resource_id, now)
                    after = consumer.cursor
                    if items:
                        await self.notify()
            except ItemsMissed as missed:
                after = await self._newest()
                self.log.resync(f"missed: {missed}", time.monotonic())
            except ListenerError as error:
                await self.failed(error)
            finally:
                await consumer.aclose()

    async def _newest(self) -> str | None:
        """The newest cursor of the log (None: it is empty), asked until a publisher answers."""
        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    async with session.get(self.url + "/changefeeds/events",
                                           params={"max_results": "1", "wait_time": "0.001"},
                                           timeout=aiohttp.ClientTimeout(total=5)) as reply:
                        if reply.status == 200:
                            return (await reply.json()).get("newest") or None
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await self.failed(RuntimeError("events unavailable"))


class DurableReader(Reader):
    """Instances of the durable consumer `billing`, one per URL, acking every message; every
    applied ack and every dead-letter record is recorded."""

    def __init__(self, log: ListenerLog, urls: Sequence[str]) -> None:
        super().__init__(log, urls)
        self.dead: list[dict[str, Any]] = []

    async def _run(self) -> None:
        consumers = [DurableConsumer(url, "billing", resource=RESOURCE, ack_wait=5,
                                     max_deliver=1000, start="first") for url in self.urls]
        try:
            await asyncio.gather(*(self._instance(c) for c in consumers), self._dead(consumers))
        finally:
            for consumer in consumers:
                await consumer.aclose()

    async def _instance(self, consumer: DurableConsumer) -> None:
        while True:
            try:
                await consumer.ensure()
                self.started.set()
                messages = await consumer.fetch(50, expires=EXPIRES)
                now = time.monotonic()
                for msg in messages:
                    self.log.change(msg.cursor, msg.item.changed_resource_id, now)
                if messages:
                    settled = await consumer.ack(messages)
                    now = time.monotonic()
                    for msg, result in zip(messages, settled, strict=True):
                        if result.applied:
                            self.log.acked(msg.cursor, msg.item.changed_resource_id, now)
                    await self.notify()
            except ConsumerRecreated:
                # The consumer was lost with Redis's state and made again by an ensure: the
                # instance's announcement of what it may have missed.
                self.log.resync("consumer recreated", time.monotonic())
            except ListenerError as error:
                await self.failed(error)

    async def _dead(self, consumers: list[DurableConsumer]) -> None:
        """Read the dead-letter record every second: `epoch` and `trimmed` records are the
        consumer's announcements of a loss; any other is an error (every item is acked)."""
        after: str | None = None
        while True:
            await asyncio.sleep(1.0)  # the record is a stream with no push to this client
            for consumer in consumers:
                try:
                    page = await consumer.dead_letters(after=after)
                except ListenerError:
                    continue
                for record in page["records"]:
                    after = record["id"]
                    self.dead.append(record)
                    if record["reason"] in ("epoch", "trimmed"):
                        self.log.resync(f"dead letter {record['reason']}", time.monotonic())
                    else:
                        self.log.error(f"dead-lettered: {record}")
                break


class FeedReader(Reader):
    """`GET /changefeeds/feed/v1?n=1&cursor0=<checkpoint>&wait=3`, from `_last`."""

    async def _run(self) -> None:
        checkpoint = "_last"
        gone = False
        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    checkpoint, gone = await self._page(session, checkpoint, gone)
                except (aiohttp.ClientError, TimeoutError, ValueError) as error:
                    await self.failed(error)

    async def _page(self, session: aiohttp.ClientSession, checkpoint: str,
                    gone: bool) -> tuple[str, bool]:
        params = {"n": "1", "cursor0": checkpoint, "wait": str(EXPIRES),
                  "pagesizehint": "500"}
        async with session.get(self.url + "/changefeeds/feed/v1", params=params,
                               timeout=aiohttp.ClientTimeout(total=EXPIRES + 5)) as reply:
            if reply.status == 410:
                return "_last", True
            if reply.status != 200:
                raise ValueError(f"feed: {reply.status} {await reply.text()}")
            body = await reply.read()
        now = time.monotonic()
        if gone:  # a new starting point after a 410: what was before it is announced, and
            self.log.resync("410 CursorGone", now)  # the page's changes come after it
        for line in body.splitlines():
            record = orjson.loads(line)
            if "data" in record:
                item = record["data"]
                self.log.change(item["cursor"], item["changedResourceId"], now)
            elif "cursor" in record:
                checkpoint = record["cursor"]
        self.started.set()
        await self.notify()
        return checkpoint, False


__all__ = ["DurableReader", "FeedReader", "PullReader", "Reader", "SseReader"]
