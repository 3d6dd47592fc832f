"""The redis-py client of a bucket's URL, and the one place where redis-py's errors become ours.

`connect` gives a client for any Redis URL (plain, `redis+sentinel://`, `redis+cluster://`) that
never sends a commit twice; `translate_redis_errors` turns redis-py's errors into the project's
(`changefeed.errors`). A commit tells two failures apart: `BucketUnavailable` when no connection
could be had, so nothing was sent; `CommitOutcomeUnknown` when the script was sent and no answer
came, so it may have run.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, cast

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from changefeed.errors import (
    BucketBusy,
    BucketUnavailable,
    ChangeError,
    ChangefeedError,
    CommitOutcomeUnknown,
    PartitionMismatch,
)
from publisher.bucket.redis.cluster_client import connect_cluster
from publisher.bucket.redis.cluster_url import is_cluster_url
from publisher.bucket.redis.sentinel import is_sentinel_url, sentinel_pool


def _partitions_error(what: str, message: str) -> ChangefeedError:
    return PartitionMismatch(
        f"bucket.partitions: {message} (the partition count is fixed when the bucket is created)"
    )


def _key_reused_error(what: str, message: str) -> ChangefeedError:
    count, _, key = message.partition(" ")
    return ChangeError(
        f"{what}: idempotency key {key!r} was first used for other changes ({count} of them); "
        "a key names one commit, retried with the same changes"
    )


POOL_SIZE = 64
"""Connections a client's pool holds at most (config.js `bucket.poolSize`)."""
POOL_TIMEOUT = 5.0
"""Seconds a caller waits for a pooled connection before `BucketBusy` (`bucket.poolTimeout`)."""
KEEP_FOR_COMMITS = 4
"""Pools of at least this many connections keep one for single commits (`Channel`); a smaller
pool lends its connections one call at a time to everything, single commits included."""
_POOL_EXHAUSTED = "No connection available."
"""redis-py's message when no connection of a BlockingConnectionPool came free in time."""

_SCRIPT_ERRORS = {"PARTITIONS ": _partitions_error, "KEYREUSED ": _key_reused_error}
"""Errors our scripts reply with, by prefix: the error of ours each one becomes."""


_CLUSTER_REFUSALS = (
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.RedisClusterException,
)


class _Translated:
    """`translate_redis_errors`' context: a class rather than a generator-based context manager,
    as every commit enters two and a single commit is a few hundred microseconds."""

    __slots__ = ("sent", "what")

    def __init__(self, what: str, sent: bool) -> None:
        self.what = what
        self.sent = sent

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        what = self.what
        if exc is None:
            return
        if isinstance(
            exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
        ):
            if isinstance(exc.__cause__, TimeoutError) and str(exc) == _POOL_EXHAUSTED:
                # Raised while waiting for a pooled connection: nothing was sent.
                raise BucketBusy(
                    f"{what}: every Redis connection of the pool was busy", exc
                ) from exc
            if self.sent:
                raise CommitOutcomeUnknown(
                    f"{what}: no answer from Redis ({exc}); the commit may have been written", exc
                ) from exc
            raise BucketUnavailable(f"{what}: Redis unreachable ({exc})", exc) from exc
        if isinstance(exc, _CLUSTER_REFUSALS):
            # A Redis Cluster refused before running anything (down, a slot not served, no
            # node reachable): nothing was written.
            raise BucketUnavailable(f"{what}: Redis Cluster unavailable ({exc})", exc) from exc
        if isinstance(exc, redis.exceptions.ResponseError):
            for prefix, error in _SCRIPT_ERRORS.items():
                if str(exc).startswith(prefix):
                    raise error(what, str(exc).removeprefix(prefix)) from None
            raise ChangefeedError(f"{what}: Redis error ({exc})") from exc
        if isinstance(exc, redis.exceptions.RedisError):
            raise ChangefeedError(f"{what}: Redis error ({exc})") from exc


def translate_redis_errors(what: str, *, sent: bool = False) -> AbstractAsyncContextManager[None]:
    """The one place where redis-py's errors become ours.

    `sent`: the block has sent (or may have sent) a commit when it fails to hear the answer, so
    a lost connection or a timeout means the commit may have been written (CommitOutcomeUnknown),
    not that nothing was (BucketUnavailable).
    """
    return _Translated(what, sent)


def connect(
    url: str,
    *,
    blocking: bool = False,
    timeout: float | None = None,
    pool_size: int = POOL_SIZE,
    pool_timeout: float = POOL_TIMEOUT,
) -> aioredis.Redis:
    """A redis-py client for `url` that never sends a commit twice (a commit without an
    idempotency key is not idempotent).

    Its pool holds at most `pool_size` connections; a caller that finds them all busy waits up to
    `pool_timeout` seconds for one, then gets `BucketBusy` (overload, not an outage).
    `blocking` clients wait longer for a reply, for XREAD BLOCK (which waits at most 5 s);
    `timeout` overrides how long any reply is waited for (seconds).

    A `redis+sentinel://` URL (`publisher.bucket.redis.sentinel`) gives a client of the master the
    sentinels name, with the same pool: each new connection asks the sentinels, so the client
    follows a failover.

    A `redis+cluster://` URL gives redis-py's `RedisCluster` (`connect_cluster`); a `ChangeBucket`
    made with it spreads its partitions over the cluster's masters (`publisher.bucket.log.layout`):
    the usual `ChangeBucket(connect(url), name, resources)` works for any URL.
    """
    if is_cluster_url(url):
        cluster: Any = connect_cluster(url, blocking=blocking, timeout=timeout,
                                       pool_size=pool_size)
        return cast(aioredis.Redis, cluster)
    options: dict[str, Any] = dict(
        max_connections=pool_size,
        timeout=pool_timeout,
        # One retry, on a fresh connection, when a pooled connection turns out dead (Redis
        # restarted since it was last used): every command redis-py sends for us is a read or an
        # idempotent write. Commits bypass this (commit_batches sends them itself), and so never
        # run twice; timeouts are not retried either.
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)),
        socket_connect_timeout=5,
        socket_timeout=timeout or (20 if blocking else 10),
        health_check_interval=0,
    )
    pool: aioredis.ConnectionPool
    if is_sentinel_url(url):
        pool = sentinel_pool(url, **options)
    else:
        pool = aioredis.BlockingConnectionPool.from_url(url, **options)
    return aioredis.Redis.from_pool(pool)


def bulk(value: bytes) -> bytes:
    """`value` as a RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


EMPTY = bulk(b"")


__all__ = [
    "EMPTY",
    "KEEP_FOR_COMMITS",
    "POOL_SIZE",
    "POOL_TIMEOUT",
    "bulk",
    "connect",
    "translate_redis_errors",
]
