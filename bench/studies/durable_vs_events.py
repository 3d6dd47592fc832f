"""What a durable consumer costs next to the plain `events` pull (issue 17, item 4).

    python -m bench.studies.durable_vs_events [--items 5000] [--batch 100] [--rounds 3]

A real publisher (`changefeed serve`, its own process) on a real redis-server; `items` changes
committed first, then each reader drains that backlog through the publisher, in the same run:

1. `events`: `PullConsumer.fetch(batch)` (the `events` long poll, `order=oldest`): the baseline;
2. `durable, batch ack`: `DurableConsumer.fetch(batch)`, then one `ack` request for the batch;
3. `durable, ack each`: `DurableConsumer.fetch(batch)`, then `msg.ack()` per message.

Each is timed from its first request to its last answer (items/s), `rounds` times in turn (the
three readers one after the other in each round); reported: the median rate, and the median of
the per-round ratios to `events` (each against the baseline of its own round, so that the
machine's load, which moves from round to round, cancels out).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from changefeed_testing.servers import PublisherProcess, RedisServer, write_config
from listener import DurableConsumer, PullConsumer
from publisher.bucket import Change, ChangeBucket, connect
from publisher.config.settings import load_config


async def events(url: str, items: int, batch: int) -> int:
    async with PullConsumer(url) as consumer:
        seen = 0
        while seen < items:
            seen += len(await consumer.fetch(batch, expires=5))
        return seen


async def durable(url: str, name: str, items: int, batch: int, each: bool) -> int:
    async with DurableConsumer(url, name, max_ack_pending=10000) as consumer:
        seen = 0
        while seen < items:
            msgs = await consumer.fetch(batch, expires=5)
            if each:
                for msg in msgs:
                    assert (await msg.ack()).applied
            else:
                assert all(r.applied for r in await consumer.ack(msgs))
            seen += len(msgs)
        await consumer.delete()  # the next round starts afresh from the first item
        return seen


async def timed(run: Callable[[], Awaitable[int]]) -> float:
    started = time.perf_counter()
    count = await run()
    return count / (time.perf_counter() - started)


async def main(items: int, batch: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp) / "redis").start()
        config_path = write_config(Path(tmp) / "config.js", redis.url, durable={
            "consumers": ["bench"], "maxAckPending": 10000,
        }, limits={"maxResults": 1000})
        config = load_config(config_path)
        publisher = PublisherProcess(config_path).start()
        bucket = ChangeBucket(connect(redis.url), "test", config.resources)
        try:
            changes = [Change.publish("vm", f"vm-{n:06}", ["nic"]) for n in range(items)]
            await bucket.commit_many(changes)
            runs: dict[str, Callable[[], Awaitable[int]]] = {
                "events": lambda: events(publisher.url, items, batch),
                "durable, batch ack": lambda: durable(publisher.url, "bench", items, batch, False),
                "durable, ack each": lambda: durable(publisher.url, "bench", items, batch, True),
            }
            rates: dict[str, list[float]] = {name: [] for name in runs}
            for _ in range(rounds):
                for name, run in runs.items():
                    rates[name].append(await timed(run))
        finally:
            await bucket.aclose()
            publisher.stop()
            redis.stop()
    base = rates["events"]
    print(f"{items} items, batches of {batch}, {rounds} rounds")
    print("| reader | items/s (median) | items/s per round | ratio to events (median; per round) |")
    print("| --- | --- | --- | --- |")
    for name, values in rates.items():
        ratios = [value / b for value, b in zip(values, base, strict=True)]
        shown = ", ".join(f"{v:,.0f}" for v in values)
        each = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"| {name} | {statistics.median(values):,.0f} | {shown} | "
              f"{statistics.median(ratios):.2f}x; {each} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.studies.durable_vs_events")
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    asyncio.run(main(arguments.items, arguments.batch, arguments.rounds))
