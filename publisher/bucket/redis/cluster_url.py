"""Redis Cluster: the `redis+cluster://` URL and config.js's `bucket.cluster` list.

    redis+cluster://[[user]:password@]host:port[,host:port...]/

names some of the cluster's nodes (any of them: the client learns the others and which master
holds which slot from them) and the password every node shares. config.js may list the nodes
instead, as `bucket: { cluster: ["redis://host:port", ...] }`, which is the same URL.

Pure code: parsing and checking only; the client is made in `publisher.bucket.redis.cluster_client`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from changefeed import configjs as cj
from changefeed.errors import ConfigError

SCHEME = "redis+cluster"
EXPECTED = "a redis+cluster://[:password@]host:port[,host:port...]/ URL"


@dataclass(frozen=True, slots=True)
class ClusterUrl:
    """The parts of a `redis+cluster://` URL."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None

    def to_url(self) -> str:
        return f"{SCHEME}://{cj.hosts_netloc(self.nodes, self.username, self.password)}/"


def is_cluster_url(url: str | None) -> bool:
    return isinstance(url, str) and url.startswith(SCHEME + "://")


def parse_cluster_url(key: str, url: str) -> ClusterUrl:
    """The parts of `url`; ConfigError naming `key` (the URL shown without its password)."""
    found = cj.hosts_url(key, url, SCHEME, EXPECTED, host="node", node="a cluster node's")
    if found.parts.path.strip("/") or found.parts.query:
        raise ConfigError(
            key, cj.masked_url(url),
            EXPECTED + " with no database (a cluster has only database 0) or query",
        )
    return ClusterUrl(found.nodes, found.username, found.password)


def cluster_section(key: str, value: Any) -> str:
    """config.js's `bucket.cluster` (a list of `redis://[:password@]host:port` node URLs) as the
    `redis+cluster://` URL it means; errors name the key and mask passwords."""
    if not isinstance(value, list) or not value:
        shown = value if not isinstance(value, str) else cj.masked_url(value)
        raise ConfigError(key, shown, 'a non-empty list of "redis://host:port" node URLs')
    nodes: list[tuple[str, int]] = []
    username = password = None
    for number, item in enumerate(value):
        where = f"{key}[{number}]"
        if not isinstance(item, str):
            raise ConfigError(where, item, 'a "redis://host:port" node URL')
        shown = cj.masked_url(item)
        try:
            parts = urlsplit(item)
            port = parts.port
        except ValueError:
            raise ConfigError(where, shown, "a URL with a valid port") from None
        if parts.scheme != "redis" or not parts.hostname or port is None:
            raise ConfigError(where, shown, 'a "redis://host:port" node URL')
        if parts.path.strip("/") not in ("", "0") or parts.query:
            raise ConfigError(where, shown, "no database but 0 and no query (a cluster node)")
        if parts.password is not None:
            if password is not None and parts.password != password:
                raise ConfigError(where, shown, "the same password as the other nodes")
            username, password = unquote(parts.username or "") or None, unquote(parts.password)
        nodes.append((parts.hostname, port))
    return ClusterUrl(tuple(nodes), username, password).to_url()


__all__ = [
    "EXPECTED",
    "SCHEME",
    "ClusterUrl",
    "cluster_section",
    "is_cluster_url",
    "parse_cluster_url",
]
