"""Redis Sentinel: the `redis+sentinel://` URL, and a pool that follows the master.

    redis+sentinel://[[user]:password@]host:port[,host:port...]/master[/db][?sentinelPassword=...]

names the sentinels to ask, the master's name as the sentinels know it (`sentinel monitor
<master> ...`), the database, and the passwords: the one in the user part is the master's, the
`sentinelPassword` query parameter the sentinels' own (when they require one).

`SentinelPool` is redis-py's `SentinelConnectionPool` with the blocking behaviour of
`BlockingConnectionPool`: at most `max_connections`, a caller waits `timeout` seconds for a free
one (then `BucketBusy`, as with a plain Redis). Every new connection asks the sentinels where the
master is, and a connection that hears READONLY (the old master came back as a replica) is
dropped. The pool also asks every second while in use; at every look, its own or a new
connection's, it closes every connection, in use or not, that leads to another node than the
master the sentinels name (`SentinelPool`), and a closed connection opens again only to the
master the sentinels name then (`FollowingConnection`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode

import structlog
from redis.asyncio.connection import BlockingConnectionPool, Connection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from changefeed import configjs as cj
from changefeed.errors import ConfigError
from changefeed.tasks import cancel_and_wait
from publisher.bucket.redis.cluster_url import is_cluster_url, parse_cluster_url

log = structlog.get_logger(__name__)

SCHEME = "redis+sentinel"
FOLLOW_EVERY = 1.0
"""Seconds between a pool's looks at the master the sentinels name."""
EXPECTED = (
    "a redis+sentinel://[:password@]host:port[,host:port...]/master[/db][?sentinelPassword=...] "
    "URL"
)


@dataclass(frozen=True, slots=True)
class SentinelUrl:
    """The parts of a `redis+sentinel://` URL."""

    nodes: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None

    def to_url(self) -> str:
        """The URL again (passwords quoted), for a config's `bucket.sentinel` object."""
        netloc = cj.hosts_netloc(self.nodes, self.username, self.password)
        query = (
            "" if self.sentinel_password is None
            else "?" + urlencode({"sentinelPassword": self.sentinel_password})
        )
        return f"{SCHEME}://{netloc}/{quote(self.master, safe='')}/{self.db}{query}"


def is_sentinel_url(url: str) -> bool:
    return url.startswith(SCHEME + "://")


def node(key: str, text: str) -> tuple[str, int]:
    """A sentinel's `host:port` (or `[v6]:port`) as a pair; ConfigError naming `key` otherwise."""
    return cj.address(key, text, "a sentinel")


def parse_sentinel_url(key: str, url: str) -> SentinelUrl:
    """The parts of `url`; ConfigError naming `key` (the URL shown without passwords)."""
    shown = cj.masked_url(url)
    found = cj.hosts_url(key, url, SCHEME, EXPECTED, host="sentinel", node="a sentinel")
    parts = found.parts
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ConfigError(key, shown, EXPECTED + " naming the master (/mymaster or /mymaster/0)")
    db = 0
    if len(path) == 2:
        if not path[1].isdigit():
            raise ConfigError(key, shown, "a database number after the master's name")
        db = int(path[1])
    query = dict(parse_qsl(parts.query))
    unknown = set(query) - {"sentinelPassword"}
    if unknown:
        raise ConfigError(key, shown, "no query parameter but sentinelPassword")
    return SentinelUrl(found.nodes, path[0], db, found.username, found.password,
                       query.get("sentinelPassword"))


def redis_url(key: str, value: Any) -> str:
    """A Redis URL as `changefeed.configjs.redis_url` checks it, or a `redis+sentinel://` or
    `redis+cluster://` one."""
    if isinstance(value, str) and is_sentinel_url(value):
        parse_sentinel_url(key, value)
        return value
    if isinstance(value, str) and is_cluster_url(value):
        parse_cluster_url(key, value)
        return value
    try:
        return cj.redis_url(key, value)
    except ConfigError as exc:
        raise ConfigError(key, exc.value, exc.expected.replace(
            "rediss:// or unix:// URL",
            "rediss://, unix:// or redis+sentinel:// URL (or redis+cluster://)")) from None


SENTINEL_KEYS = {"master", "nodes", "db", "password", "sentinelPassword"}


def sentinel_section(key: str, value: Any) -> str:
    """config.js's `bucket.sentinel` object, as the `redis+sentinel://` URL it means."""
    section = cj.section(value, key)
    cj.only(section, key + ".", SENTINEL_KEYS)
    master = section.get("master")
    if not isinstance(master, str) or not master:
        raise ConfigError(f"{key}.master", master, "the master's name as the sentinels know it")
    nodes = section.get("nodes")
    if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) for n in nodes):
        raise ConfigError(f"{key}.nodes", nodes, "a non-empty list of sentinel \"host:port\"")
    db = section.get("db", 0)
    if not isinstance(db, int) or isinstance(db, bool) or db < 0:
        raise ConfigError(f"{key}.db", db, "a database number (0 or more)")
    secrets: dict[str, str | None] = {}
    for name in ("password", "sentinelPassword"):
        secret = section.get(name)
        if secret is not None and (not isinstance(secret, str) or not secret):
            raise ConfigError(f"{key}.{name}", "***", "a non-empty string")
        secrets[name] = secret
    parts = SentinelUrl(
        tuple(node(f"{key}.nodes", n) for n in nodes), master, db, None,
        secrets["password"], secrets["sentinelPassword"],
    )
    return parts.to_url()


class FollowingConnection(SentinelManagedConnection):
    """A connection to the master that, closed, opens again to the master the sentinels name
    now, whatever opens it.

    redis-py's `SentinelManagedConnection` asks the sentinels in `connect()` only; a command
    sent on a closed connection (`send_packed_command`, as redis-py's retry of a command whose
    connection failed does) opens it again to the address it had. A connection `_settle` closed
    because it led to the old master then went straight back to it: paused past the sentinels'
    patience, that master takes the connection in the kernel and answers it when it runs
    again, a master of its own until a sentinel demotes it (the nemesis's 30-minute soak, seed
    12: a publisher read the old epoch there after its tail had read the new one, and a pull
    reader got a change twice)."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self.is_connected:
            await self.connect()  # type: ignore[no-untyped-call]  # the sentinels' master
        await super().send_packed_command(command, check_health)


class SentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """A sentinel-managed pool that blocks (BlockingConnectionPool's get_connection/release)
    while asking the sentinels for the master (SentinelConnectionPool's connections), and that
    follows the master: once it has given out a connection it asks the sentinels every
    `FOLLOW_EVERY` seconds; at each look (and at each new connection's) it closes every
    connection to another node than the master they name, those in use too (a tail's kept
    read, a writer's kept channel).

    redis-py asks only when it opens a connection, and closes only idle ones. A kept connection
    then stays on the old master as long as that answers: a master paused past the sentinels'
    patience, or killed and started again before the failover ended, is a master of its own
    until a sentinel demotes it (8 s or more later), and takes writes that its resync will throw
    away while the other publishers read the new master (found by the nemesis,
    faults/nemesis). Asking costs one SENTINEL MASTERS a second per pool; the sentinels'
    `+switch-master` messages would come from one sentinel at a time, lost with it."""

    sentinel_manager: Sentinel
    _follower: asyncio.Task[None] | None = None
    _closing = False

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if not self._closing and (self._follower is None or self._follower.done()):
            self._follower = asyncio.get_running_loop().create_task(self._follow())
        try:
            return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        except RuntimeError as exc:
            # The connection was closed under its handshake (`_settle`: it led to the old
            # master); uvloop says so with a RuntimeError. Nothing was sent: an outage.
            raise RedisConnectionError(f"the connection closed while it opened ({exc})") from exc

    async def get_master_address(self) -> Any:
        """The master the sentinels name now, as redis-py asks it for every new connection;
        every connection that leads elsewhere is closed (`_settle`)."""
        address = await self.sentinel_manager.discover_master(self.service_name)
        await self._settle(address)
        return address

    async def _follow(self) -> None:
        """Every FOLLOW_EVERY seconds: the master the sentinels name, and `_settle`; until the
        pool closes. The flag, not only the task's cancellation, ends it: a cancellation that
        arrives while redis-py asks the sentinels under a timeout can come out as a timeout,
        caught below, and the loop went on for ever while `aclose` waited for it (a hang of the
        fault suite's Sentinel failover, twice in some hundred runs)."""
        while not self._closing:
            await asyncio.sleep(FOLLOW_EVERY)
            try:
                address = await self.sentinel_manager.discover_master(self.service_name)
            except (RedisError, OSError):
                continue  # no sentinel answers, or none names a master: the next look will
            await self._settle(address)

    async def _settle(self, address: Any) -> None:
        """Make `address` the master: close every open connection to another node, those in
        use too. redis-py's own look (a new connection's) closes only the idle ones, and
        records the new address, so comparing addresses alone missed the connections in use
        whenever a new connection looked first (the nemesis again, seed 12: a publisher read
        the old master and the new one by turns for ten seconds and served two epochs)."""
        master = tuple(address)
        known = self.master_address
        self.master_address = address
        if known is not None and tuple(known) != master:
            log.warning("the sentinels name another master: closing every connection to "
                        "the old one", master=self.service_name,
                        old=f"{known[0]}:{known[1]}", new=f"{master[0]}:{master[1]}")
        stale = [
            c for c in (*self._available_connections, *self._in_use_connections)
            if isinstance(c, Connection) and c.is_connected and (c.host, c.port) != master
        ]
        # Without waiting for the close to finish: the old master may be paused, and until the
        # close returns the connection counts as open and can be taken for another command.
        await asyncio.gather(*(c.disconnect(nowait=True) for c in stale), return_exceptions=True)

    async def aclose(self) -> None:
        """Stop following, close the connections to the master, then those to the sentinels."""
        self._closing = True
        if self._follower is not None:
            await cancel_and_wait(self._follower)
        await super().aclose()
        await self.sentinel_manager.aclose()


def sentinel_pool(url: str, **connection_kwargs: object) -> SentinelPool:
    """A `SentinelPool` for the master `url` names; `connection_kwargs` are those of the
    connections to the master (max_connections and timeout are the pool's)."""
    parts = parse_sentinel_url("redis url", url)
    socket_kwargs = {
        k: v for k, v in connection_kwargs.items() if k.startswith("socket_")
    }
    # A sentinel that does not answer is not asked again: the next one is (redis-py's default,
    # three retries with a backoff of up to 10 s each, made a commit with every sentinel down
    # wait 24 s to say it was not written).
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(parts.nodes),
        sentinel_kwargs={
            **socket_kwargs, "password": parts.sentinel_password, "retry": Retry(NoBackoff(), 0),
        },
    )
    return SentinelPool(  # type: ignore[no-untyped-call]
        parts.master,
        sentinel,
        connection_class=FollowingConnection,
        db=parts.db,
        username=parts.username,
        password=parts.password,
        **connection_kwargs,
    )


__all__ = [
    "FOLLOW_EVERY",
    "SCHEME",
    "FollowingConnection",
    "SentinelPool",
    "SentinelUrl",
    "is_sentinel_url",
    "node",
    "parse_sentinel_url",
    "redis_url",
    "sentinel_pool",
    "sentinel_section",
]
