"""Redis Sentinel: the `redis+sentinel://` URL, and a pool that follows the master.

    redis+sentinel://[[user]:password@]host:port[,host:port...]/master[/db][?sentinelPassword=...]

names the sentinels to ask, the master's name as the sentinels know it (`sentinel monitor
<master> ...`), the database, and the passwords: the one in the user part is the master's, the
`sentinelPassword` query parameter the sentinels' own (when they require one).

`SentinelPool` is redis-py's `SentinelConnectionPool` with the blocking behaviour of
`BlockingConnectionPool`: at most `max_connections`, a caller waits `timeout` seconds for a free
one (then `BucketBusy`, as with a plain Redis). Every new connection asks the sentinels where the
master is; when the master changed, the idle connections to the old one are closed, and a
connection that hears READONLY (the old master came back as a replica) is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

from changefeed import configjs as cj
from changefeed.errors import ConfigError
from publisher.bucket.cluster_url import is_cluster_url, parse_cluster_url

SCHEME = "redis+sentinel"
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
        user = ""
        if self.password is not None:
            user = f"{quote(self.username or '', safe='')}:{quote(self.password, safe='')}@"
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.nodes)
        query = (
            "" if self.sentinel_password is None
            else "?" + urlencode({"sentinelPassword": self.sentinel_password})
        )
        return f"{SCHEME}://{user}{hosts}/{quote(self.master, safe='')}/{self.db}{query}"


def is_sentinel_url(url: str) -> bool:
    return url.startswith(SCHEME + "://")


def node(key: str, text: str) -> tuple[str, int]:
    """A sentinel's `host:port` (or `[v6]:port`) as a pair; ConfigError naming `key` otherwise."""
    return cj.address(key, text, "a sentinel")


def parse_sentinel_url(key: str, url: str) -> SentinelUrl:
    """The parts of `url`; ConfigError naming `key` (the URL shown without passwords)."""
    shown = cj.masked_url(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigError(key, shown, EXPECTED) from None
    if parts.scheme != SCHEME:
        raise ConfigError(key, shown, EXPECTED)
    hosts, username, password = cj.userinfo(parts.netloc)
    if not hosts:
        raise ConfigError(key, shown, EXPECTED + " with at least one sentinel host:port")
    nodes = tuple(node(key, piece) for piece in hosts.split(","))
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
    return SentinelUrl(nodes, path[0], db, username, password, query.get("sentinelPassword"))


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


class SentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """A sentinel-managed pool that blocks (BlockingConnectionPool's get_connection/release)
    while asking the sentinels for the master (SentinelConnectionPool's connections)."""

    sentinel_manager: Sentinel

    async def aclose(self) -> None:
        """Close the connections to the master, then those to the sentinels."""
        await super().aclose()
        await self.sentinel_manager.aclose()


def sentinel_pool(url: str, **connection_kwargs: object) -> SentinelPool:
    """A `SentinelPool` for the master `url` names; `connection_kwargs` are those of the
    connections to the master (max_connections and timeout are the pool's)."""
    parts = parse_sentinel_url("redis url", url)
    socket_kwargs = {
        k: v for k, v in connection_kwargs.items() if k.startswith("socket_")
    }
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(parts.nodes),
        sentinel_kwargs={**socket_kwargs, "password": parts.sentinel_password},
    )
    return SentinelPool(  # type: ignore[no-untyped-call]
        parts.master,
        sentinel,
        db=parts.db,
        username=parts.username,
        password=parts.password,
        **connection_kwargs,
    )


__all__ = [
    "SCHEME",
    "SentinelPool",
    "SentinelUrl",
    "is_sentinel_url",
    "node",
    "parse_sentinel_url",
    "redis_url",
    "sentinel_pool",
    "sentinel_section",
]
