"""A herd of resumes: `size.herd` websocket clients register at once with `since`, against one
publisher that has just started (so every replay reads Redis, not the in-memory window).

Every client must get `resumed: true`, the changes after its cursor, then the live ones. A
refusal (1013: Redis unavailable, when it is not) or any other close is counted as an error.
The clients are bare websockets (the protocol of docs/protocol.md, no Listener library): 500
Listener instances would mostly measure the test process.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import orjson
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from changefeed_testing.servers import scaled
from faults.harness import RESOURCE, Rig, Row, Size
from faults.records import Attempt, ListenerLog

BEFORE = 60
SINCE = 10
LIVE = 20


class ResumingClient:
    """One bare websocket client that resumes after `since` and records what it gets."""

    def __init__(self, log: ListenerLog, ws_url: str, since: str) -> None:
        self.log = log
        self.ws_url = ws_url
        self.since = since
        self.registered = asyncio.Event()
        self.done = asyncio.Event()
        self.target: Attempt | None = None

    def aim(self, target: Attempt) -> None:
        """Stop once `target` has arrived (it may have already)."""
        self.target = target
        if self.log.received(target):
            self.done.set()

    async def run(self) -> None:
        registration = {"instance": f"{self.log.name}-instance", "service": "herd",
                        "changeKind": {"resource": RESOURCE, "subResources": ["*"]},
                        "since": self.since}
        try:
            async with connect(self.ws_url, additional_headers={"Accept-Version": "~1"},
                               open_timeout=scaled(60)) as ws:
                await ws.send(orjson.dumps(registration).decode())
                reply = orjson.loads(await ws.recv())
                if not reply.get("resumed"):
                    self.log.resync("resumed: false", time.monotonic())
                self.registered.set()
                async for frame in ws:
                    item = orjson.loads(frame)
                    self.log.change(item["cursor"], item["changedResourceId"], time.monotonic())
                    if self.target is not None and self.log.received(self.target):
                        self.done.set()
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
            self.log.error(f"closed {code} {closed.rcvd.reason if closed.rcvd else ''}")
        except (OSError, TimeoutError) as error:
            self.log.error(f"could not connect: {error!r}")
        finally:
            self.registered.set()
            self.done.set()


async def herd_of_resumes(size: Size, directory: Path) -> Row:
    async with Rig(directory) as rig:
        server = await rig.redis()
        config = rig.config(server)
        writer = await rig.writer(config, size)
        before = await writer.commit_many(BEFORE)
        publisher = await rig.publisher(config)  # its window starts empty, at the head
        since = before[SINCE - 1]
        clients = [ResumingClient(rig.history.listener(f"herd-{n:03}", after=since),
                                  publisher.ws_url, since.cursor or "")
                   for n in range(size.herd)]
        start = time.monotonic()
        tasks = [asyncio.create_task(client.run()) for client in clients]
        try:
            async with asyncio.timeout(scaled(60)):
                await asyncio.gather(*(c.registered.wait() for c in clients))
            registered = time.monotonic() - start
            for _ in range(LIVE):
                await writer.commit()
            assert writer.last is not None
            for client in clients:
                client.aim(writer.last)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(scaled(30)):
                    await asyncio.gather(*(c.done.wait() for c in clients))
            behind = [c.log.name for c in clients
                      if writer.last is None or not c.log.received(writer.last)]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        errors = sorted({e for c in clients for e in c.log.errors})
        notes = [f"{size.herd} clients registered in {registered:.2f} s", *errors[:3]]
        return rig.row(f"herd of {size.herd} resumes", start, behind[:3] + (
            [f"... {len(behind)} in all"] if len(behind) > 3 else []), notes)
