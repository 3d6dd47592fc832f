"""Where redis-py's errors become ours: `translate_redis_errors`, the one place, used by every
module of the bucket that talks to Redis (`client.py` and the small stores beside it).

A commit tells two failures apart: `BucketUnavailable` when no connection could be had, so nothing
was sent; `CommitOutcomeUnknown` when the script was sent and no answer came, so it may have run.
`BucketBusy` is overload (no pooled connection came free in time), not an outage. The errors our
scripts reply with (`PARTITIONS `, `KEYREUSED `) become `PartitionMismatch` and `ChangeError`.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from types import TracebackType

import redis.exceptions

from changefeed.errors import (
    BucketBusy,
    BucketUnavailable,
    ChangeError,
    ChangefeedError,
    CommitOutcomeUnknown,
    PartitionMismatch,
)


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


__all__ = ["translate_redis_errors"]
