"""The systems a scenario measures, started and stopped as a unit: ours (a private Redis and a
publisher) and the bare baseline (`bench.broadcast`, with the same Redis when it reads one)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from bench.scenario import Context
from bench.servers import (
    RESOURCE,
    Server,
    baseline_loop,
    baseline_port,
    publisher,
    publisher_loop,
    publisher_url,
    python_module,
    redis_server,
    redis_url,
    write_config,
)
from changefeed.protocol import Resource
from publisher.bucket import ChangeBucket, connect
from publisher.config.settings import load_config

Seed = Callable[[ChangeBucket], Awaitable[None]]


@dataclass
class Stack:
    server: Server
    """The process under test: the publisher, or the baseline server."""
    port: int
    redis: Server | None
    redis_url: str
    resources: list[Resource]
    loop: str
    """The event loop the server says it runs on."""

    def bucket(self) -> ChangeBucket:
        return ChangeBucket(connect(self.redis_url), "bench", self.resources)

    def pids(self) -> dict[str, int]:
        out = {"server": self.server.pid}
        if self.redis is not None:
            out["redis"] = self.redis.pid
        return out


@contextlib.asynccontextmanager
async def ours(
    ctx: Context, name: str, *, seed: Seed | None = None, limits: dict[str, int] | None = None,
    sections: dict[str, Any] | None = None,
    server: dict[str, int] | None = None,
    workers: int | None = None,
) -> AsyncIterator[Stack]:
    """A private redis-server (load cores) and `changefeed serve` (the server core). `seed`
    writes to the bucket before the publisher starts, so its tail starts after those items.
    `sections`: more top-level config.js sections (e.g. `{"trace": {"items": 0}}`); `workers`
    overrides the run's `--workers` (P10: more sockets than one process may open)."""
    directory = ctx.work / name
    with redis_server(directory / "redis", ctx.cores.load) as redis:
        url = redis_url(directory / "redis")
        config = write_config(directory / "config.js", url, server, sections=sections,
                              **(limits or {}))
        resources = list(load_config(config).resources)
        if seed is not None:
            bucket = ChangeBucket(connect(url), "bench", resources)
            await seed(bucket)
            await bucket.aclose()
        workers = workers or ctx.publisher_workers
        cores = ctx.cores.server if workers == 1 else ctx.cores.all
        serve = publisher(config, directory / "publisher.log", cores,
                          loop=ctx.loop, source=ctx.source, workers=workers)
        with serve:
            loop = publisher_loop(serve)
            ctx.publisher_loops.add(loop)
            port = urlsplit(publisher_url(serve)).port
            assert port is not None
            yield Stack(serve, port, redis, url, resources, loop)


@contextlib.contextmanager
def bare(ctx: Context, name: str, mode: str) -> Iterator[Stack]:
    """The bare websockets broadcast server, on the publisher's event loop; with
    `mode="stream"` a private Redis as well."""
    directory = ctx.work / name
    with contextlib.ExitStack() as stack:
        redis = None
        url = ""
        if mode == "stream":
            redis = stack.enter_context(redis_server(directory / "redis", ctx.cores.load))
            url = redis_url(directory / "redis")
        args = ["--mode", mode, "--redis", url]
        server = stack.enter_context(
            python_module("broadcast", "bench.broadcast", args, directory / "broadcast.log",
                          ctx.cores.server, ctx.loop)
        )
        loop = baseline_loop(server)
        ctx.baseline_loops.add(loop)
        yield Stack(server, baseline_port(server), redis, url, [RESOURCE], loop)
