"""Scenarios that hurt publishers: SIGKILL with listeners on one URL (the publisher is started
again on the same port) and on two URLs (high availability), and a publisher whose tail falls
behind the trimming of the log, with one and with two publishers on the bucket."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from changefeed.cursor import Position
from changefeed_testing.servers import PublisherProcess, scaled
from faults.harness import PATIENT, Rig, Row, Size, Writer, exercise
from publisher import ChangeBucket

MAX_ITEMS = 100


async def publisher_kill_one_url(size: Size, directory: Path) -> Row:
    """The only publisher SIGKILLed and started again on the same port after `size.fault` s:
    its listeners resume after their last change, without a bootstrap."""
    async with Rig(directory) as rig:
        server = await rig.redis()
        config = rig.config(server)
        publisher = await rig.publisher(config)
        await rig.listener("a", publisher.url)
        await rig.listener("b", publisher.url)

        async def kill() -> None:
            publisher.kill()

        async def restart() -> None:
            await asyncio.to_thread(publisher.start)

        return await exercise(rig, await rig.writer(config, size), size,
                              "publisher SIGKILL, one URL", kill, restart)


async def publisher_kill_two_urls(size: Size, directory: Path) -> Row:
    """Two publishers on one bucket; listeners know both URLs (in both orders) and one knows
    only the survivor. One publisher is SIGKILLed; its listeners resume on the other."""
    async with Rig(directory) as rig:
        server = await rig.redis()
        first = await rig.publisher(rig.config(server))
        second = await rig.publisher(rig.config(server))
        await rig.listener("first-then-second", [first.url, second.url])
        await rig.listener("second-then-first", [second.url, first.url])
        await rig.listener("second-only", second.url)

        async def kill() -> None:
            first.kill()

        async def restart() -> None:
            await asyncio.to_thread(first.start)

        return await exercise(rig, await rig.writer(first.config, size), size,
                              "publisher SIGKILL, two URLs", kill, restart)


async def _trimmed_past(bucket: ChangeBucket, cursor: str, within: float) -> None:
    """Wait until the bucket's trimmed horizon is at or after `cursor` (the GC of another
    publisher runs every second: there is no event to wait on but the horizon itself)."""
    position = Position.decode_single(cursor).position
    deadline = time.monotonic() + scaled(within)
    while (await bucket.log.retention()).trimmed < position:
        if time.monotonic() > deadline:
            raise AssertionError(f"the log was not trimmed past {cursor} in {within} s")
        await asyncio.sleep(0.05)


async def _paced(writer: Writer, n: int) -> None:
    """`n` more acknowledged commits, one every `writer.pace` seconds."""
    target = writer.acked + n
    await writer.run(lambda: writer.acked >= target)


async def _behind_trim(size: Size, rig: Rig, paused: PublisherProcess, config: Path,
                       trim: bool, name: str) -> Row:
    """Pause `paused` (SIGSTOP), commit `size.trim_commits` changes at once, let the log be
    trimmed to MAX_ITEMS past `paused`'s tail (by `bucket.log.trim` when `trim`, else by another
    publisher's GC), then SIGCONT: `paused`'s listeners are owed every change, or a Resync."""
    assert paused.process is not None
    for recorder in rig.recorders:
        await recorder.bootstrapped()
    writer = await rig.writer(config, size)
    await _paced(writer, 30)
    paused.process.send_signal(signal.SIGSTOP)
    started = time.monotonic()
    try:
        burst = await writer.commit_many(size.trim_commits)
        if trim:
            await writer.bucket.log.trim(None, max_items=MAX_ITEMS)
        await _trimmed_past(writer.bucket, burst[0].cursor or "", within=10)
        await asyncio.sleep(max(0.0, size.fault - (time.monotonic() - started)))  # hold it
    finally:
        paused.process.send_signal(signal.SIGCONT)
    fault_end = time.monotonic()
    await _paced(writer, 20)
    behind = await rig.settle()
    return rig.row(name, fault_end, behind)


async def tail_behind_trim_one(size: Size, directory: Path) -> Row:
    """One publisher, paused while the log grows past `maxItems` and is trimmed (the trim its
    own GC does when it wakes, done first so that the race is always lost)."""
    async with Rig(directory) as rig:
        server = await rig.redis()
        config = rig.config(server, maxItems=MAX_ITEMS, gcInterval=1)
        publisher = await rig.publisher(config)
        await rig.listener("a", publisher.url, PATIENT)
        await rig.listener("b", publisher.url, PATIENT)
        return await _behind_trim(size, rig, publisher, config, True,
                                  "tail behind trim, one publisher")


async def tail_behind_trim_two(size: Size, directory: Path) -> Row:
    """Publishers A and B (`maxItems: 100`, `gcInterval: 1`); B paused while A trims."""
    async with Rig(directory) as rig:
        server = await rig.redis()
        a = await rig.publisher(rig.config(server, maxItems=MAX_ITEMS, gcInterval=1))
        b = await rig.publisher(rig.config(server, maxItems=MAX_ITEMS, gcInterval=1))
        await rig.listener("on-a", a.url, PATIENT)
        await rig.listener("on-b-1", b.url, PATIENT)
        await rig.listener("on-b-2", b.url, PATIENT)
        return await _behind_trim(size, rig, b, a.config, False,
                                  "tail behind trim, two publishers")
