"""The redis-py client of a Redis Cluster (`redis+cluster://` URLs), for `connect()` and
`publisher.bucket.log.layout`."""

from __future__ import annotations

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from publisher.bucket.redis.cluster_url import parse_cluster_url

POOL_SIZE = 64
"""Connections per node, as `connect()`'s pools (config.js `bucket.poolSize`)."""

CLUSTER_TIMEOUT = 10.0
"""Seconds any reply is waited for, blocking reads aside."""


def connect_cluster(
    url: str, *, blocking: bool = False, timeout: float | None = None, pool_size: int = POOL_SIZE
) -> RedisCluster:
    """A redis-py cluster client for a `redis+cluster://` URL that never sends a command twice
    on its own (retries 0: a commit without an idempotency key is not idempotent). Redirects
    (MOVED, ASK) are still followed: the command did not run where it was refused."""
    parts = parse_cluster_url("redis url", url)
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in parts.nodes],
        username=parts.username,
        password=parts.password,
        max_connections=pool_size,
        retry=Retry(NoBackoff(), 0),
        socket_connect_timeout=5,
        socket_timeout=timeout or (20 if blocking else CLUSTER_TIMEOUT),
    )


__all__ = ["CLUSTER_TIMEOUT", "connect_cluster"]
