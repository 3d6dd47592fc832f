"""The nemesis' real system, and the faults it injects into it.

- Redis: nodes `a` (master at first) and `b` (its replica), both with an append-only file fsynced
  at every write, and three sentinels (quorum 2). Roles change as faults fail the master over,
  so a Redis fault always asks the sentinels which node is the master *now*.
- Three `changefeed serve` processes on fixed ports (a killed one comes back on its URL):
  publishers 0 and 1 reach Redis through the sentinels (`redis+sentinel://`); publisher 2
  through a TCP proxy that always leads to the current master, from a network namespace of its
  own where this process may make one (root, `ip`): the `partition` fault takes the veth pair
  it reaches that proxy by down (changefeed_testing/netns.py), so the kernel drops its bytes:
  established connections stall and time out, new ones time out or find no route. Listeners,
  readiness checks and its PostgreSQL reach it over a second pair that stays up. Elsewhere the
  partition is the proxy's blackhole (bytes neither delivered nor refused).
- A TCP proxy in front of publisher 0 (the `link_*` faults) that some listeners go through.
- The PostgreSQL outbox (faults/nemesis/outbox.py): a private PostgreSQL that publishers 1
  and 2 relay from, through a proxy of its own (the `relay_partition` fault blackholes it).

Publisher 2 alone is in a namespace, and reaches Redis through the proxy rather than through
Sentinel: Sentinel hands out the master's loopback address, which inside a namespace is the
namespace's own loopback; every Redis node and sentinel would have to listen and announce on
veth addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis
import redis.asyncio as aioredis

from changefeed_testing.netns import Namespace
from changefeed_testing.proxy import Proxy
from changefeed_testing.servers import (
    PublisherProcess,
    RedisServer,
    SentinelServer,
    free_port,
    scaled,
    write_config,
)
from faults.nemesis.outbox import RELAYS, OutboxSystem
from faults.nemesis.schedule import SENTINEL_DOWN_AFTER, Fault
from faults.sentinel_faults import MASTER, sentinel_ready

DRIP_BYTES_PER_SECOND = 2000
KILLS = ("publisher_kill", "relay_kill")
STOPS = ("publisher_stop", "relay_stop")
RELAY_KINDS = ("relay_kill", "relay_stop")
"""Faults of whichever publisher holds the outbox's relay lock when they begin."""
POSTGRES_KINDS = ("postgres_kill", "postgres_stop", "relay_partition")
FIND_RELAY_WITHIN = 10.0
LAGGING_HOLD = 1.5
"""A `redis_kill` held at least this long kills a master whose replicas lag (`STALL`)."""
STALL = 0.5
"""Seconds of writes a lagging kill lets the master alone acknowledge before it kills it."""
"""Seconds a relay fault waits for a publisher to hold the relay lock (after a kill or with
PostgreSQL down, none may for a while); then it injects nothing and says so."""


@dataclass
class Injected:
    """A fault as it happened: when it began and was healed (time.monotonic()), and what its
    heal needs (the node it killed, the snapshot it saved)."""

    fault: Fault
    started: float
    ended: float | None = None
    node: RedisServer | None = None
    snapshot: Path | None = None
    hit: str | None = None
    """The publisher a publisher or relay fault hit (`publisher-N`)."""
    notes: list[str] = field(default_factory=list)


class System:
    """The servers of one nemesis run, started by `start()` and stopped by `aclose()`."""

    def __init__(self, directory: Path, *, soak: bool = False) -> None:
        self.directory = directory
        self.soak = soak
        self.stack = contextlib.AsyncExitStack()
        self.nodes: list[RedisServer] = []
        self.sentinels: list[SentinelServer] = []
        self.publishers: list[PublisherProcess] = []
        self.link: Proxy | None = None
        self.redis_link: Proxy | None = None
        self.outbox = OutboxSystem()
        self.namespace = Namespace() if Namespace.available() else None
        """Publisher 2's network namespace (None: the partition is the proxy's blackhole)."""
        self.switches = 0
        self._watcher: asyncio.Task[None] | None = None

    # --- start and stop ---------------------------------------------------------------------

    async def start(self) -> None:
        await self.stack.__aenter__()
        a = RedisServer(self.directory / "redis-a", tcp=True, persist=True)
        await self._start_node(a)
        b = RedisServer(self.directory / "redis-b", tcp=True, persist=True, replica_of=a)
        await self._start_node(b)
        b.replica_of = None  # from now on every node restarts as a master; sentinels demote it
        self.nodes = [a, b]
        for n in range(3):
            sentinel = SentinelServer(self.directory / f"sentinel{n}", a, MASTER,
                                      down_after_ms=int(SENTINEL_DOWN_AFTER * 1000))
            await asyncio.to_thread(sentinel.start)
            self.stack.callback(sentinel.stop)
            self.sentinels.append(sentinel)
        await sentinel_ready(self.sentinels)
        ns = self.namespace
        if ns is not None:
            await asyncio.to_thread(ns.create)
            self.stack.callback(ns.close)
        self.redis_link = await self.stack.enter_async_context(
            Proxy("127.0.0.1", a.port, listen="127.0.0.1" if ns is None else ns.service_host))
        self._watcher = asyncio.create_task(self._follow_master())
        await self.outbox.start(self.stack, listen="127.0.0.1" if ns is None else "0.0.0.0")
        for n in range(3):
            prefix = ns.prefix if ns is not None and n == 2 else []
            process = PublisherProcess(self._config(n), prefix=prefix)
            await asyncio.to_thread(process.start)
            self.stack.callback(process.stop)
            self.publishers.append(process)
        self.link = await self.stack.enter_async_context(
            Proxy("127.0.0.1", self.port_of(self.publishers[0])))

    async def _start_node(self, node: RedisServer) -> None:
        await asyncio.to_thread(node.start)
        self.stack.callback(node.stop)

    @property
    def sentinel_url(self) -> str:
        return f"redis+sentinel://{','.join(s.address for s in self.sentinels)}/{MASTER}/0"

    def _config(self, n: int) -> Path:
        assert self.redis_link is not None
        ns = self.namespace if n == 2 else None
        url = self.sentinel_url if n < 2 else (
            f"redis://{self.redis_link.listen}:{self.redis_link.port}/0")
        limits: dict[str, Any] = {"pingInterval": 2}
        if n == 0:
            limits |= {"window": 200, "sendBuffer": 16384}  # slow listeners coalesce or 4008
        extra: dict[str, Any] = {"limits": limits, "durable": {"consumers": ["billing"]}}
        if self.soak:
            # What is bounded by design fills in the first half of a soak, so that a slope in
            # the second half is a leak, not a window or a log still filling: Redis's log is
            # trimmed after 30 s, a publisher's window and its delivery trace hold 500 items
            # (30 s of commits; the trace's default, 10,000, takes 10 minutes to fill here).
            extra["maxAge"] = 30
            extra["trace"] = {"items": 500}
            limits["window"] = min(limits.get("window", 500), 500)
        if self.soak and n == 1:
            extra["clientLimits"] = {"maxListeners": 12}  # the churn meets refusals here
        if n in RELAYS:
            extra["outbox"] = self.outbox.config("127.0.0.1" if ns is None else ns.side_host)
        host = "127.0.0.1" if ns is None else ns.inside_host
        if ns is not None:
            # Off the loopback a publisher refuses to serve without auth unless told to; the
            # namespace's veth is reachable from this machine only.
            extra["auth"] = {"mode": "none"}
        return write_config(self.directory / f"publisher{n}.js", url,
                            server={"host": host, "port": free_port()}, **extra)

    @staticmethod
    def port_of(publisher: PublisherProcess) -> int:
        return int(publisher.url.rpartition(":")[2])

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.publishers]

    async def aclose(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        for publisher in self.publishers:  # SIGCONT any paused one, so it can stop
            if publisher.process is not None and publisher.process.poll() is None:
                publisher.process.send_signal(signal.SIGCONT)
        await self.stack.aclose()
        for n, publisher in enumerate(self.publishers):  # the evidence, beside the AOFs
            (self.directory / f"publisher{n}.log").write_text(publisher.output())
        for n, sentinel in enumerate(self.sentinels):
            (self.directory / f"sentinel{n}.log").write_text(sentinel.output())
        (self.directory / "postgres.log").write_text(self.outbox.output())

    # --- the master, as the sentinels see it --------------------------------------------------

    def master(self) -> RedisServer:
        """The node the sentinels call master now (the first that answers)."""
        for sentinel in self.sentinels:
            with contextlib.suppress(redis.RedisError), redis.Redis(
                    host="127.0.0.1", port=sentinel.port, socket_timeout=2) as client:
                address = client.sentinel_get_master_addr_by_name(MASTER)
                if address:
                    return next(n for n in self.nodes if n.port == int(address[1]))
        raise RuntimeError("no sentinel names a master")

    async def _follow_master(self) -> None:
        """Keep the partition proxy leading to the master: on every `+switch-master` a sentinel
        publishes, retarget it (open connections to the old master are reset)."""
        client = aioredis.Redis(host="127.0.0.1", port=self.sentinels[0].port)
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe("+switch-master")
            async for message in pubsub.listen():
                if message["type"] != "message":
                    continue
                port = int(message["data"].split()[-1])
                assert self.redis_link is not None
                self.redis_link.retarget("127.0.0.1", port)
                self.switches += 1
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]
            await client.aclose()

    # --- faults -----------------------------------------------------------------------------

    async def aim(self, fault: Fault) -> str:
        """What `fault` hits if injected now: for a relay fault the publisher holding the relay
        lock (`publisher-N`; its own target `relay` when none does), else its target."""
        if fault.kind in RELAY_KINDS:
            n = await self.outbox.relaying(self.publishers, FIND_RELAY_WITHIN)
            return fault.target if n is None else f"publisher-{n}"
        return fault.target

    def _publisher(self, hit: str) -> PublisherProcess:
        return self.publishers[int(hit.rpartition("-")[2])]

    async def inject(self, fault: Fault, hit: str | None = None) -> Injected:
        """Inject `fault`; `hit`: what `aim` said it hits (a relay fault's publisher)."""
        done = Injected(fault, time.monotonic())
        kind = fault.kind
        if kind in KILLS or kind in STOPS:
            done.hit = hit if kind in RELAY_KINDS else fault.target
            if done.hit is None or not done.hit.startswith("publisher-"):
                done.hit = None
                done.notes.append("no publisher held the relay lock: nothing injected")
                return done
            publisher = self._publisher(done.hit)
            assert publisher.process is not None
            if kind in KILLS:
                publisher.kill()
            else:
                publisher.process.send_signal(signal.SIGSTOP)
            if kind in RELAY_KINDS:
                done.notes.append(f"the relay was {done.hit}")
        elif kind in POSTGRES_KINDS:
            self.outbox.inject(kind)
        elif kind.startswith("link_"):
            assert self.link is not None
            if kind == "link_blackhole":
                self.link.blackhole()
            elif kind == "link_drip":
                self.link.drip(DRIP_BYTES_PER_SECOND)
            else:
                self.link.cut(refuse_new=True)
        elif kind == "partition":
            assert self.redis_link is not None
            if self.namespace is not None:
                await asyncio.to_thread(self.namespace.cut)
                done.notes.append("the kernel's: its veth pair down")
            else:
                self.redis_link.blackhole()
        else:
            await self._inject_redis(done)
        return done

    async def _inject_redis(self, done: Injected) -> None:
        kind = done.fault.kind
        node = done.node = await asyncio.to_thread(self.master)
        if kind == "redis_stop":
            node.pause()
        elif kind in ("redis_kill", "redis_restart_empty"):
            if kind == "redis_kill" and done.fault.hold >= LAGGING_HOLD:
                await self._stall_replicas(node, done)
            node.kill()
        elif kind == "redis_restart_snapshot":
            done.snapshot = await asyncio.to_thread(_snapshot, node)
        elif kind == "sentinel_failover":
            try:
                with redis.Redis(host="127.0.0.1", port=self.sentinels[0].port) as client:
                    await asyncio.to_thread(client.execute_command, "SENTINEL", "FAILOVER",
                                            MASTER)
            except redis.ResponseError as error:  # NOGOODSLAVE, INPROG: noted, not a failure
                done.notes.append(f"SENTINEL FAILOVER refused: {error}")

    async def _stall_replicas(self, master: RedisServer, done: Injected) -> None:
        """The replicas follow `master` through a link that carries nothing, for STALL seconds
        of writes: the master alone acknowledges them, and the replica the sentinels promote
        once it is killed lacks them (issue 30: a failover that loses acknowledged writes, some
        retried by their writers and acknowledged again by the new master). Each stays a
        replica, the sentinels' choice; the promotion ends its link."""
        stall = await self.stack.enter_async_context(Proxy("127.0.0.1", master.port))
        stall.blackhole()
        for node in self.nodes:
            if node is not master:
                with contextlib.suppress(redis.RedisError), redis.Redis(
                        host="127.0.0.1", port=node.port, socket_timeout=2) as client:
                    await asyncio.to_thread(client.replicaof, "127.0.0.1", stall.port)
        await asyncio.sleep(STALL)  # the writers' traffic, which the master alone takes
        done.notes.append(f"the replicas lagged {STALL}s before the kill")

    async def heal(self, done: Injected) -> None:
        kind = done.fault.kind
        if done.hit is not None:
            publisher = self._publisher(done.hit)
            assert publisher.process is not None
            if kind in KILLS:
                await asyncio.to_thread(publisher.start)
            else:
                publisher.process.send_signal(signal.SIGCONT)
        elif kind in POSTGRES_KINDS:
            await self.outbox.heal(kind)
        elif kind.startswith("link_"):
            assert self.link is not None
            self.link.pass_through()
        elif kind == "partition":
            assert self.redis_link is not None
            if self.namespace is not None:
                await asyncio.to_thread(self.namespace.mend)
            else:
                self.redis_link.pass_through()
        elif done.node is not None:
            await self._heal_redis(done, done.node)
        done.ended = time.monotonic()

    async def _heal_redis(self, done: Injected, node: RedisServer) -> None:
        kind = done.fault.kind
        if kind == "redis_stop":
            node.resume()
        elif kind == "redis_kill":
            await asyncio.to_thread(node.start)
        elif kind == "redis_restart_empty":
            _wipe(node)
            await asyncio.to_thread(node.start)
        elif kind == "redis_restart_snapshot":
            assert done.snapshot is not None
            node.kill()
            _wipe(node)
            shutil.copy(done.snapshot, node.directory / "dump.rdb")
            await asyncio.to_thread(node.start)

    async def evidence(self) -> None:
        """Write each publisher's `/changefeeds/stats`, the outbox's status and each node's INFO
        and CLIENT LIST into the run's directory (what the logs do not say about the end state)."""
        async with aiohttp.ClientSession() as session:
            for n, url in enumerate(self.urls):
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(url + "/changefeeds/stats",
                                           timeout=aiohttp.ClientTimeout(total=3)) as reply:
                        (self.directory / f"publisher{n}-stats.json").write_bytes(
                            await reply.read())
        status = await self.outbox.status()
        (self.directory / "outbox-status.txt").write_text(f"{status!r}\n")
        for node in self.nodes:
            with contextlib.suppress(redis.RedisError), redis.Redis(
                    host="127.0.0.1", port=node.port, socket_timeout=2) as client:
                info = client.execute_command("INFO", "replication")
                clients = client.execute_command("CLIENT", "LIST")
                epoch = client.get("{test}:epoch")
                newest = client.execute_command("XREVRANGE", "{test}:log", "+", "-", "COUNT", 3)
                (node.directory.parent / f"{node.directory.name}-end.txt").write_text(
                    f"{info!r}\n{clients!r}\nepoch {epoch!r}\nnewest {newest!r}\n")

    # --- health -----------------------------------------------------------------------------

    async def ready(self, within: float) -> dict[str, float | None]:
        """Seconds until each publisher's `/readyz` answered 200, and until Redis had one master
        again (None: not within `within`)."""
        started = time.monotonic()
        async with aiohttp.ClientSession() as session:
            results = await asyncio.gather(
                *(_ready(session, url, started, scaled(within)) for url in self.urls),
                self._one_master(started, scaled(within)), self._relaying(started, within))
        names = [f"publisher-{n}" for n in range(len(self.urls))] + ["redis", "relay"]
        return dict(zip(names, results, strict=True))

    async def _relaying(self, started: float, within: float) -> float | None:
        """Seconds until a publisher held the outbox's relay lock."""
        if await self.outbox.relaying(self.publishers, within) is None:
            return None
        return time.monotonic() - started

    async def _one_master(self, started: float, within: float) -> float | None:
        """Seconds until exactly one node says it is a master, the one the sentinels name (a
        killed master restarted after a failover is a master of its own, a split brain, until a
        sentinel demotes it: about 8 s)."""
        while time.monotonic() - started < within:
            with contextlib.suppress(RuntimeError, StopIteration):
                master = await asyncio.to_thread(self.master)
                roles = await asyncio.gather(*(asyncio.to_thread(_role, n) for n in self.nodes))
                masters = [n for n, role in zip(self.nodes, roles, strict=True)
                           if role == "master"]
                if masters == [master]:
                    return time.monotonic() - started
            await asyncio.sleep(0.2)  # roles change by the sentinels' own timers: no event
        return None


async def _ready(session: aiohttp.ClientSession, url: str, started: float,
                 within: float) -> float | None:
    while time.monotonic() - started < within:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(url + "/readyz",
                                   timeout=aiohttp.ClientTimeout(total=2)) as reply:
                if reply.status == 200:
                    return time.monotonic() - started
        await asyncio.sleep(0.1)  # /readyz is polled: it has no event to wait on
    return None


def _role(node: RedisServer) -> str | None:
    """What `node` says it is (`master`, `slave`), None when it does not answer."""
    try:
        with redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=2) as client:
            return str(client.info("replication")["role"])
    except redis.RedisError:
        return None


def _snapshot(node: RedisServer) -> Path:
    """SAVE an RDB snapshot of `node` now and keep a copy of it."""
    with redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=10) as client:
        client.save()
    kept = node.directory.parent / f"{node.directory.name}-older.rdb"
    shutil.copy(node.directory / "dump.rdb", kept)
    return kept


def _wipe(node: RedisServer) -> None:
    """Remove everything `node` would load at start (its AOF and RDB)."""
    shutil.rmtree(node.directory / "appendonlydir", ignore_errors=True)
    (node.directory / "dump.rdb").unlink(missing_ok=True)


def names(faults: Sequence[Injected]) -> list[str]:
    return [i.fault.describe() for i in faults]


__all__ = ["DRIP_BYTES_PER_SECOND", "KILLS", "RELAY_KINDS", "STOPS", "Injected", "System",
           "names"]
