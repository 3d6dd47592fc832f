"""The core of a `ChangeBucket`: its shards, its identity (epoch, partitions, retention) and
the validation of changes. `publisher.bucket.client` has the whole picture.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

import redis.asyncio as aioredis

from changefeed.cursor import AnyCursor, CompositeCursor, Cursor, StreamId, new_epoch
from changefeed.errors import (
    ChangeError,
    ChangefeedError,
)
from changefeed.protocol import Resource
from publisher.bucket import scripts
from publisher.bucket.connection import translate_redis_errors
from publisher.bucket.keys import Keys, partition_of
from publisher.bucket.layout import is_sharded, make_shards
from publisher.bucket.shard import Shard
from publisher.bucket.values import (
    MAX_ID_BYTES,
    Change,
    PackedChanges,
    Retention,
    encode_change,
    pack_changes,
)
from publisher.bucket.vector import Vector, decode_vector

IDEMPOTENCY_KEYS = 100_000
"""Most idempotency keys a bucket remembers; past it the oldest are forgotten first."""
KINDS_REMEMBERED = 4096
"""(resource, sub-resources) pairs a bucket remembers as valid (`ChangeBucket.validate`)."""


def _not_ordered(what: str) -> ChangefeedError:
    return ChangefeedError(
        f"{what} needs an ordered bucket (one shard: a single Redis or Sentinel; "
        "`ChangeBucket.ordered`); a bucket in a Redis Cluster has one log per partition"
    )


class BucketCore:
    """What the commit path (`BucketWrites`) and the reads (`BucketReads`) of a `ChangeBucket`
    share: the shards and the epoch."""

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
        self.keys = Keys(name)
        """The keys of the whole bucket (`{name}`); a shard's are its own (`Shard.keys`)."""
        self.name = name
        self.resources = {r.resource: r for r in resources} if resources is not None else None
        self.partitions = partitions
        self.idempotency_keys = idempotency_keys
        self.sharded = is_sharded(client)
        self.ordered = not self.sharded
        """The bucket's items have one total order (one shard: a single Redis or Sentinel):
        `events` with `before` and newest first, and cursors ``<epoch>.<id>``. False for a
        bucket in a Redis Cluster (one log per partition; composite cursors)."""
        self._shards: list[Shard] = (
            [] if self.sharded else make_shards(client, name, partitions, idempotency_keys, False)
        )
        self.epoch: str | None = None
        """The bucket's epoch, as last read or created (`ensure`)."""
        self._ensure = client.register_script(scripts.ENSURE.text)
        self._renew_epoch = client.register_script(scripts.RENEW_EPOCH.text)
        self._fitting: set[tuple[str, tuple[str, ...]]] = set()
        """(resource, sub-resources) pairs that `validate` found fitting."""

    # --- the shards ----------------------------------------------------------------------

    async def shards(self) -> list[Shard]:
        """The bucket's shards, shard 0 first (for a bucket in a Redis Cluster, one per
        partition: the configured count, else the bucket's stored count, else 1)."""
        if not self._shards:
            n = self.partitions or await self._stored_partitions() or 1
            self._shards = make_shards(self.redis, self.name, n, self.idempotency_keys, True)
        return self._shards

    async def _stored_partitions(self) -> int | None:
        async with translate_redis_errors("partitions"):
            stored = await self.redis.get(self.keys.partitions)
        return int(stored) if stored is not None else None

    def _shard(self) -> Shard:
        """The one shard of an ordered bucket."""
        if not self.ordered:
            raise _not_ordered("this call")
        return self._shards[0]

    async def locate(self, partition: int) -> tuple[Shard, int]:
        """The shard holding the bucket's partition `partition`, and its number there."""
        shards = await self.shards()
        return (shards[0], partition) if self.ordered else (shards[partition], 0)

    async def shard_of(self, changed_resource_id: str) -> Shard:
        """The shard a change of `changed_resource_id` goes to."""
        shards = await self.shards()
        return shards[0] if self.ordered else shards[partition_of(changed_resource_id,
                                                                   len(shards))]

    def vector(self, epoch: str, positions: Sequence[StreamId]) -> Vector:
        """A position of this bucket: one stream id per shard."""
        return Vector(epoch, tuple(positions), self.sharded)

    async def decode_cursor(self, text: str) -> Vector:
        """The vector a cursor of this bucket names (CursorError when it is not one: see
        `decode_vector`). The epoch is the caller's to compare."""
        return decode_vector(text, len(await self.shards()), self.sharded)



    # --- writing -------------------------------------------------------------------------

    def validate(self, change: Change) -> None:
        """Raise ChangeError if `change` does not fit the configured resources.

        A (resource, sub-resources) pair that fitted once is remembered (up to KINDS_REMEMBERED
        of them), so a writer of many changes checks each kind once, and each change's id."""
        id = change.changed_resource_id
        if not isinstance(id, str) or not id:
            raise ChangeError("changedResourceId must be a non-empty string")
        if len(id) * 4 > MAX_ID_BYTES and len(id.encode()) > MAX_ID_BYTES:
            raise ChangeError(f"changedResourceId longer than {MAX_ID_BYTES} bytes")
        kind = (change.resource, change.sub_resources)
        hashable = type(change.sub_resources) is tuple
        try:
            if hashable and kind in self._fitting:
                return
        except TypeError:  # a sub-resource that is not even hashable: refused below
            hashable = False
        if not change.sub_resources or not all(isinstance(s, str) for s in change.sub_resources):
            raise ChangeError("a change needs at least one sub-resource name")
        if self.resources is not None:
            resource = self.resources.get(change.resource)
            if resource is None:
                known = ", ".join(sorted(self.resources))
                raise ChangeError(f"unknown resource {change.resource!r} (known: {known})")
            unknown = [s for s in change.sub_resources if s not in resource.sub_resources]
            if unknown:
                raise ChangeError(
                    f"unknown sub-resource(s) {', '.join(map(repr, unknown))} of "
                    f"{change.resource!r} (known: {', '.join(resource.sub_resources)})"
                )
        if hashable and len(self._fitting) < KINDS_REMEMBERED:
            self._fitting.add(kind)


    def _pack(self, changes: Sequence[Change]) -> PackedChanges:
        """`changes` validated and packed for one commit.lua call (ChangeError: one does not fit;
        orjson's error: a state is not JSON)."""
        for change in changes:
            self.validate(change)
        return pack_changes([encode_change(change) for change in changes])

    # --- the bucket's identity -----------------------------------------------------------

    async def ping(self, what: str = "ping") -> None:
        """Raise BucketUnavailable (saying `what` was tried) unless Redis answers."""
        async with translate_redis_errors(what):
            await self.redis.ping()

    async def ensure(self) -> str:
        """The bucket's epoch, creating the bucket (epoch and partition count) if it has none,
        and giving each shard of a bucket in a Redis Cluster its copy where it is missing or
        stale.

        Raises PartitionMismatch when the bucket was created with another partition count.
        """
        shards = await self.shards()
        if self.ordered:
            epoch, _ = await shards[0].ensure(new_epoch())
            self.epoch = epoch
            return epoch
        async with translate_redis_errors("epoch"):
            found, _ = await self._ensure(keys=self.keys.common, args=[new_epoch(), len(shards)])
        await self._adopt(found.decode())
        return str(found.decode())

    async def _adopt(self, epoch: str) -> None:
        """Give every shard the bucket's epoch (created, or replaced after a renewal)."""
        self.epoch = epoch
        shards = await self.shards()
        for shard in shards:
            shard.commits.adopt(epoch)
        await asyncio.gather(*(shard.set_epoch(epoch) for shard in shards))

    async def _epoch(self) -> str:
        return self.epoch if self.epoch is not None else await self.ensure()

    async def current_epoch(self) -> str | None:
        """The bucket's epoch, or None when the bucket does not exist (yet, or any more)."""
        if self.ordered:
            return await self._shards[0].current_epoch()
        async with translate_redis_errors("epoch"):
            epoch: Any = await self.redis.get(self.keys.epoch)
        return epoch.decode() if epoch else None

    async def renew_epoch(self, known: str) -> str:
        """Start a new epoch if the bucket's is still `known` (a rollback was seen), given to
        every shard; returns the bucket's epoch after it ('' when the bucket has none)."""
        if self.ordered:
            return await self._shards[0].renew_epoch(known, new_epoch())
        async with translate_redis_errors("epoch"):
            epoch: Any = await self._renew_epoch(keys=self.keys.common, args=[known, new_epoch()])
        renewed = str(epoch.decode())
        if renewed:
            await self._adopt(renewed)
        return renewed

    async def partition_count(self) -> int:
        """How many partitions the log has (learnt from the bucket once it exists)."""
        if self.ordered:
            return await self._shards[0].partition_count()
        return len(await self.shards())

    async def streams(self) -> list[str]:
        """The partition streams, partition 0 first."""
        return [s for shard in await self.shards() for s in await shard.streams()]

    async def retentions(self) -> list[Retention]:
        """What each shard's log retains (its epoch, trimmed horizon, head, oldest entry)."""
        shards = await self.shards()
        return list(await asyncio.gather(*(shard.retention() for shard in shards)))

    async def retention(self) -> Retention:
        """What the log of an ordered bucket retains (`retentions` for any bucket)."""
        return await self._shard().retention()

    async def head(self) -> Vector | None:
        """The bucket's head: every shard's (None before the bucket has an epoch)."""
        epoch = await self.current_epoch()
        if epoch is None:
            return None
        return self.vector(epoch, [r.head for r in await self.retentions()])

    async def head_cursor(self) -> AnyCursor | None:
        """The bucket's head as a cursor (None before the bucket has an epoch): a `Cursor` for an
        ordered bucket, a `CompositeCursor` for one in a Redis Cluster."""
        head = await self.head()
        if head is None:
            return None
        if head.composite:
            return CompositeCursor(head.epoch, head.positions)
        return Cursor(head.epoch, head.positions[0])


__all__ = ["IDEMPOTENCY_KEYS", "KINDS_REMEMBERED", "BucketCore"]
