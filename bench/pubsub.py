"""P2's first baseline: Redis PUBLISH -> SUBSCRIBE latency, one subscriber in its own process.

The driver publishes stamped items (`bench.items`) at the run's rate; the subscriber (redis-py,
blocking) records each one's age in a histogram and sends it back over a pipe.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from multiprocessing.connection import Connection

import redis

from bench import items
from bench.histogram import Histogram

CHANNEL = "bench:latency"


def _subscribe(url: str, origin_ns: int, cores: frozenset[int], pipe: Connection) -> None:
    os.sched_setaffinity(0, cores)
    client = redis.Redis.from_url(url)
    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    pubsub.subscribe(CHANNEL)
    pubsub.get_message(timeout=5)
    pipe.send("ready")
    histogram = Histogram()
    while True:
        message = pubsub.get_message(timeout=0.2)
        now = time.monotonic_ns()
        if message is not None:
            data = message["data"]
            found = items.stamp_in(data, 0, len(data))
            if found is not None:
                histogram.add(items.age_us(found, now, origin_ns))
        if pipe.poll():
            command = pipe.recv()
            if command == "mark":
                histogram = Histogram()
            elif command == "report":
                pipe.send(histogram.to_wire())
            else:
                return


class Subscriber:
    def __init__(self, url: str, origin_ns: int, cores: frozenset[int]) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipe, child = context.Pipe()
        self.process = context.Process(target=_subscribe, args=(url, origin_ns, cores, child),
                                       daemon=True)
        self.process.start()
        if not self.pipe.poll(30) or self.pipe.recv() != "ready":
            raise RuntimeError("redis subscriber did not start")

    def mark(self) -> None:
        self.pipe.send("mark")

    def report(self) -> Histogram:
        self.pipe.send("report")
        return Histogram.merged([self.pipe.recv()])

    def close(self) -> None:
        self.pipe.send("stop")
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
