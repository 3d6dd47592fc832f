"""`ChangeBucket`: the change bucket and the authoritative store, in Redis.

A bucket is a set of shards (`publisher.bucket.shard`), each a slot-local log with one id
sequence whose scripts (commit, tail, read, retention, trim, page) run on one Redis; which shards
a bucket has is decided from its client by `publisher.bucket.layout`, and nowhere else:

- a single Redis or a Sentinel-managed Redis: one shard holding every partition (they share one
  id sequence): the bucket is `ordered`, a total order of its items, and its cursor is
  ``<epoch>.<id>``;
- a Redis Cluster: one shard per partition, each under its own hash tag ``{name/p}`` with its own
  sequence, spread over the masters by slot; a position is one id per shard, its cursor
  composite. A commit over several partitions is one atomic commit per shard (concurrently):
  when one fails after another was written, `CommitOutcomeUnknown` (or the refusal's error)
  says which partitions were written; idempotency keys are per shard (`key/p`); the bucket's
  epoch lives in ``{name}:epoch`` and each shard keeps a copy its scripts check.

What belongs to the whole bucket stays under ``{name}`` (`keys`): its epoch and partition count,
the fleet's reports, feed cursor sets, Spark ledgers and durable consumers.

`commit` writes the state and appends the item in one Lua script, so the store and the bucket
never disagree. `trim` removes items older than maxAge and records the horizon; it is idempotent,
so every publisher on a bucket may run it. redis-py's errors become ours in
`publisher.bucket.connection` and nowhere else.
"""
from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property

from changefeed.protocol import Resource
from publisher.bucket.cluster_url import is_cluster_url
from publisher.bucket.commits import StreamStats
from publisher.bucket.connection import POOL_SIZE, POOL_TIMEOUT, connect
from publisher.bucket.core import IDEMPOTENCY_KEYS
from publisher.bucket.cursor_sets import CursorSets
from publisher.bucket.fleet import FleetStore
from publisher.bucket.layout import Settings
from publisher.bucket.ledgers import SparkLedgers
from publisher.bucket.reads import BucketReads
from publisher.bucket.writes import (
    BATCH,
    REPLICAS_TIMEOUT,
    Batch,
    BucketWrites,
    EncodedBatch,
    KeyOf,
)


class ChangeBucket(BucketWrites, BucketReads):
    """Commits changes, reads the log and the store, and trims: one bucket, in a single Redis,
    a Sentinel-managed Redis or a Redis Cluster (the client says which: see the module's
    docstring). Its commit path is `BucketWrites`, its reads `BucketReads`, its shards and epoch
    `BucketCore`.

    `partitions` is the partition count the bucket must have (the configured one); None accepts
    whatever the bucket was created with (1 for a new bucket). `idempotency_keys` bounds how many
    idempotency keys the bucket remembers.

    >>> bucket = ChangeBucket(connect("redis://127.0.0.1:6379/0"), "changefeed", resources)
    >>> cursor = await bucket.commit("vm", vm_uuid, ["nic"], state, key=request_id)
    """

    # --- small stores of bucket-wide keys ({name}) ---------------------------------------

    @cached_property
    def fleet(self) -> FleetStore:
        """The reports of the publishers on this bucket (advertise, withdraw, publishers)."""
        return FleetStore(self.redis, self.keys)

    @cached_property
    def ledgers(self) -> SparkLedgers:
        """The Spark writers' micro-batch ledgers and txn records."""
        return SparkLedgers(self.redis, self.keys)

    @cached_property
    def cursor_sets(self) -> CursorSets:
        """The cursor sets feed consumers store (save_cursors, load_cursors)."""
        return CursorSets(self.redis, self.keys)

    async def aclose(self) -> None:
        for shard in self._shards:
            await shard.aclose()
        await self.redis.aclose()


def open_bucket(
    source: str | Settings,
    name: str | None = None,
    resources: Iterable[Resource] | None = None,
    partitions: int | None = None,
    *,
    tail: bool = False,
    pool_size: int = POOL_SIZE,
    pool_timeout: float = POOL_TIMEOUT,
) -> ChangeBucket:
    """The bucket of a Redis URL (any kind: plain, Sentinel, Redis Cluster), or of a loaded
    config (`publisher.config.Config`: its `bucket` section and resources; `name`, `resources`
    and `partitions` then come from it).

    `tail`: a client for a tail's blocking reads, with a connection of its own per shard, so that
    a blocking read never waits behind requests, nor they on it.

    >>> bucket = open_bucket("redis+cluster://10.0.0.1:7000/", "changefeed", resources, 16)
    >>> bucket = open_bucket(config)
    """
    if isinstance(source, str):
        url = source
    else:
        settings = source.bucket
        if settings.redis_url is None:
            raise ValueError("open_bucket: the config has no bucket URL (no embedded Redis yet)")
        url, name, resources = settings.redis_url, settings.name, source.resources
        partitions, pool_size = settings.partitions, settings.pool_size
        pool_timeout = getattr(settings, "pool_timeout", pool_timeout)
    if name is None:
        raise ValueError("open_bucket: a bucket name is needed with a URL")
    if tail:
        pool_size = (partitions or 1) + 2 if is_cluster_url(url) else 2
    client = connect(url, blocking=tail, pool_size=pool_size, pool_timeout=pool_timeout)
    return ChangeBucket(client, name, resources, partitions)


__all__ = [
    "BATCH",
    "IDEMPOTENCY_KEYS",
    "REPLICAS_TIMEOUT",
    "Batch",
    "ChangeBucket",
    "EncodedBatch",
    "KeyOf",
    "StreamStats",
    "open_bucket",
]
