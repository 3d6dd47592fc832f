"""`ChangeBucket`: the change bucket and the authoritative store, in Redis.

The service author's face: `commit`, `commit_many`, `publish`, `get`, `page`,
`wait_for_replicas`, `aclose`. What the publisher itself does with the bucket (its tail, reads,
trim, epoch) goes through `ChangeBucket.log` (`publisher.bucket.log.log.Log`), and the small
stores of bucket-wide keys through `fleet`, `ledgers`, `cursor_sets` and `durables`.

A bucket is a set of shards (`publisher.bucket.log.shard`), each a slot-local log with one id
sequence whose scripts (commit, tail, read, retention, trim, page) run on one Redis; which shards
a bucket has is decided from its client by `publisher.bucket.log.layout`, and nowhere else:

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
`publisher.bucket.redis.connection` and nowhere else.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from functools import cached_property
from typing import Any

import redis.asyncio as aioredis

from changefeed.errors import BucketUnavailable, ReplicationTimeout
from changefeed.protocol import Resource
from publisher.bucket.log.commits import StreamStats
from publisher.bucket.log.layout import Settings
from publisher.bucket.log.log import IDEMPOTENCY_KEYS, Log
from publisher.bucket.log.writes import BATCH, Batch, EncodedBatch, KeyOf
from publisher.bucket.redis.cluster_url import is_cluster_url
from publisher.bucket.redis.connection import POOL_SIZE, POOL_TIMEOUT, connect
from publisher.bucket.stores.cursor_sets import CursorSets
from publisher.bucket.stores.durable import DurableStore
from publisher.bucket.stores.fleet import FleetStore
from publisher.bucket.stores.ledgers import SparkLedgers
from publisher.bucket.values.changes import Change, Piece, StatePage

REPLICAS_TIMEOUT = 2.0
"""Seconds `commit(..., replicas=N)` waits for the replicas by default."""


class ChangeBucket:
    """Commits changes and reads the store: one bucket, in a single Redis, a Sentinel-managed
    Redis or a Redis Cluster (the client says which: see the module's docstring).

    `partitions` is the partition count the bucket must have (the configured one); None accepts
    whatever the bucket was created with (1 for a new bucket). `idempotency_keys` bounds how many
    idempotency keys the bucket remembers.

    >>> bucket = ChangeBucket(connect("redis://127.0.0.1:6379/0"), "changefeed", resources)
    >>> cursor = await bucket.commit("vm", vm_uuid, ["nic"], state, key=request_id)
    """

    def __init__(
        self,
        client: aioredis.Redis,
        name: str,
        resources: Iterable[Resource] | None = None,
        partitions: int | None = None,
        *,
        idempotency_keys: int = IDEMPOTENCY_KEYS,
    ) -> None:
        self.redis = client
        """The redis-py client: the bucket's own. Other modules use the methods."""
        self.name = name
        self.log = Log(client, name, resources, partitions, idempotency_keys=idempotency_keys)
        """The log over the bucket's shards: the publisher's interface to it (tail, reads,
        trim, epoch, retention, pages)."""
        self.keys = self.log.keys

    # --- committing ----------------------------------------------------------------------

    async def commit(
        self,
        resource: str,
        id: str,
        sub_resources: Sequence[str],
        state: Any = None,
        *,
        delete: bool = False,
        key: str | None = None,
        replicas: int = 0,
        replicas_timeout: float = REPLICAS_TIMEOUT,
    ) -> str:
        """Store `state` (or delete it) and append the change item atomically; return its cursor.

        A commit retried with the same idempotency `key` returns the first one's cursor and
        writes nothing. With `replicas`, it returns only once that many replicas have the commit
        (Redis WAIT), else raises ReplicationTimeout after `replicas_timeout` seconds (the
        commit is written on the master all the same).

        >>> cursor = await bucket.commit("vm", vm_uuid, ["nic"], {"uuid": vm_uuid}, key=request_id)
        """
        change = (
            Change.delete(resource, id, sub_resources)
            if delete
            else Change.put(resource, id, sub_resources, state)
        )
        cursors = await self.commit_replicated(
            [change], key=key, replicas=replicas, timeout=replicas_timeout
        )
        return cursors[0]

    async def commit_many(self, changes: Iterable[Change], *, key: str | None = None) -> list[str]:
        """Commit changes atomically per batch of BATCH, in order; returns their cursors.

        Every change is validated before anything is sent; each batch is then encoded while
        Redis runs the ones before it (up to WINDOW in flight), so a state that orjson cannot
        encode fails its batch, after the batches before it are in. With an idempotency `key`,
        batch n of the call is committed under `key` (n = 0) or `key#n`: a call retried with the
        same key and the same changes writes only the batches that did not get in, and returns
        every change's original cursor. In a Redis Cluster partition p's batches are committed
        under `key/p` and `key/p#n`: a commit over several partitions is atomic per partition.

        >>> cursors = await bucket.commit_many([Change.put("vm", id, ["nic"], state)], key=k)
        """
        changes = list(changes)
        self.log.validator.validate_all(changes)
        return await self.log.commit_many(changes, key)

    async def commit_replicated(
        self,
        changes: Iterable[Change],
        *,
        key: str | None = None,
        replicas: int = 0,
        timeout: float = REPLICAS_TIMEOUT,
    ) -> list[str]:
        """`commit_many`, then wait until `replicas` replicas have the changes (none: no wait).

        Raises ReplicationTimeout (with the cursors) when fewer replicas confirmed them within
        `timeout` seconds: they are written on the master, and lost if it fails before a
        replica has them.

        >>> cursors = await bucket.commit_replicated(changes, key=k, replicas=1)
        """
        if replicas <= 0:
            return await self.commit_many(changes, key=key)
        changes = list(changes)
        cursors = await self.commit_many(changes, key=key)
        await self._replicated(changes, cursors, replicas, timeout)
        return cursors

    async def _replicated(
        self, changes: Sequence[Change], cursors: list[str], replicas: int, timeout: float
    ) -> None:
        """Wait until `replicas` replicas of every shard written have the changes; raise
        ReplicationTimeout (with the cursors) when fewer confirmed within `timeout`."""
        written = {id(s): s for s in [await self.log.shard_of(c.changed_resource_id)
                                      for c in changes]}
        try:
            counts = await asyncio.gather(
                *(shard.wait_for_replicas(replicas, timeout) for shard in written.values())
            )
        except BucketUnavailable as exc:
            raise ReplicationTimeout(
                f"commit: written on the master, but whether {replicas} replica(s) have "
                f"it is unknown: {exc}", cursors, replicas, 0,
            ) from exc
        acknowledged = min(counts, default=replicas)
        if acknowledged < replicas:
            raise ReplicationTimeout(
                f"commit: written on the master, but only {acknowledged} of {replicas} "
                f"replica(s) confirmed it within {timeout:g} s",
                cursors, replicas, acknowledged,
            )

    async def wait_for_replicas(self, replicas: int, timeout: float) -> int:
        """Wait up to `timeout` seconds until `replicas` replicas have every write the masters
        acknowledged before this call; returns how many had them on the master that had fewest
        (Redis WAIT, on each shard's master: `Shard.wait_for_replicas`)."""
        return min(await self.log.wait_for_replicas(replicas, timeout))

    async def publish(
        self, resource: str, id: str, sub_resources: Sequence[str], *, key: str | None = None
    ) -> str:
        """Append a change item only (the service's store lives elsewhere). Returns the cursor."""
        return (await self.commit_many([Change.publish(resource, id, sub_resources)], key=key))[0]

    async def publish_many(
        self, changes: Iterable[tuple[str, str, Sequence[str]]], *, key: str | None = None
    ) -> list[str]:
        """`publish` of several changes, committed as `commit_many` commits them."""
        return await self.commit_many((Change.publish(r, i, s) for r, i, s in changes), key=key)

    # --- reading the store ---------------------------------------------------------------

    async def get(self, resource: str, id: str) -> bytes | None:
        """The stored state of one resource object as JSON bytes, or None."""
        return await self.log.get(resource, id)

    async def page(self, resource: str, after_id: str | None, limit: int) -> StatePage:
        """Up to `limit` stored states of `resource` with ids after `after_id`, in id order."""
        start = "-" if after_id is None else "(" + after_id
        return await self.log.page_pieces(resource, [Piece(start, "+")], limit)

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

    @cached_property
    def durables(self) -> DurableStore:
        """The durable pull consumers of this bucket."""
        return DurableStore(self.redis, self.keys)

    async def aclose(self) -> None:
        await self.log.aclose()
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
