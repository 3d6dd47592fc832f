"""`Log`: a bucket's log over its shards, the publisher's interface to it (tail, reads, trim,
epoch, retention, pages), a single Redis or Sentinel being one shard.

Each operation is written once over the shards (`publisher.bucket.log.layout` decides how many
there are and nowhere else): where a single Redis and a Redis Cluster differ it is in where a
thing lives (the bucket's epoch: the one shard's keys, or ``{name}:epoch`` with a copy in each
shard), never in a second copy of the operation. The commits are `publisher.bucket.log.writes`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import redis.asyncio as aioredis

from changefeed.cursor import Position, StreamId, new_epoch
from changefeed.errors import ChangefeedError
from changefeed.protocol import Resource
from publisher.bucket.log import writes
from publisher.bucket.log.commits import StreamStats
from publisher.bucket.log.layout import is_ordered, make_shards
from publisher.bucket.log.shard import Shard
from publisher.bucket.lua import scripts
from publisher.bucket.redis.connection import translate_redis_errors
from publisher.bucket.values.changes import (
    Change,
    Committed,
    LogEntry,
    LogRead,
    Piece,
    Retention,
    StatePage,
)
from publisher.bucket.values.keys import Keys, partition_of
from publisher.bucket.values.validation import Validator
from publisher.bucket.values.vector import Vector, decode_vector

IDEMPOTENCY_KEYS = 100_000
"""Most idempotency keys a bucket remembers; past it the oldest are forgotten first."""


def _not_ordered(what: str) -> ChangefeedError:
    return ChangefeedError(
        f"{what} needs an ordered bucket (one shard: a single Redis or Sentinel; "
        "`Log.ordered`); a bucket in a Redis Cluster has one log per partition"
    )


class Log:
    """The log of bucket `name` over its shards, and the store beside it (see the module's
    docstring). `partitions`: the partition count the bucket must have (None: whatever it was
    created with)."""

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
        self.keys = Keys(name)
        """The keys of the whole bucket (`{name}`); a shard's are its own (`Shard.keys`)."""
        self.name = name
        self.partitions = partitions
        self.idempotency_keys = idempotency_keys
        self.validator = Validator(resources)
        self.ordered = is_ordered(client)
        """The bucket's items have one total order (one shard: a single Redis or Sentinel):
        `events` with `before` and newest first, and cursors ``<epoch>.<id>``. False for a
        bucket in a Redis Cluster (one log per partition; composite cursors)."""
        self._shards: list[Shard] = (
            make_shards(client, name, partitions, idempotency_keys, ordered=True)
            if self.ordered else []
        )
        self.epoch: str | None = None
        """The bucket's epoch, as last read or created (`ensure`)."""
        self._ensure = client.register_script(scripts.ENSURE.text)
        self._renew_epoch = client.register_script(scripts.RENEW_EPOCH.text)

    # --- the shards ----------------------------------------------------------------------

    async def shards(self) -> list[Shard]:
        """The bucket's shards, shard 0 first (for a bucket in a Redis Cluster, one per
        partition: the configured count, else the bucket's stored count, else 1)."""
        if not self._shards:
            async with translate_redis_errors("partitions"):
                stored = await self.redis.get(self.keys.partitions)
            n = self.partitions or (int(stored) if stored is not None else 1)
            self._shards = make_shards(self.redis, self.name, n, self.idempotency_keys,
                                       ordered=False)
        return self._shards

    async def shards_to_commit(self) -> list[Shard]:
        """The shards, each holding the bucket's epoch: the one shard of an ordered bucket makes
        its own at its first commit; the shards of a bucket in a Redis Cluster are given the
        bucket's where they lack it."""
        shards = await self.shards()
        if not self.ordered and self.epoch is None:
            await self.ensure()
        return shards

    def key_in(self, key: str, shard: int) -> str:
        """The idempotency key under which shard `shard` commits its part of a commit made
        under `key` (idempotency keys are per shard: `key/<partition>` in a Redis Cluster)."""
        return key if self.ordered or not key else f"{key}/{shard}"

    def ordered_shard(self) -> Shard:
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
        return shards[partition_of(changed_resource_id, len(shards))]

    def vector(self, epoch: str, positions: Sequence[StreamId]) -> Vector:
        """A position of this bucket: one stream id per shard."""
        return Vector(epoch, tuple(positions), not self.ordered)

    async def decode_cursor(self, text: str) -> Vector:
        """The vector a cursor of this bucket names (CursorError when it is not one: see
        `decode_vector`). The epoch is the caller's to compare."""
        return decode_vector(text, len(await self.shards()), not self.ordered)

    def validate(self, change: Change) -> None:
        """Raise ChangeError if `change` does not fit the configured resources."""
        self.validator.validate(change)

    # --- commits (publisher.bucket.log.writes) -------------------------------------------

    async def commit_many(self, changes: Sequence[Change], key: str | None) -> list[str]:
        """`ChangeBucket.commit_many` of validated `changes` (`writes.commit_many`)."""
        cursors, renewed = await writes.commit_many(
            await self.shards_to_commit(), changes, key, self.key_in)
        if renewed is not None:
            # A shard's head was behind what this client had been acknowledged: the bucket
            # (not only the shard) starts a new epoch.
            await self.renew_epoch(renewed)
        return cursors

    async def commit_stream(
        self, batches: Iterator[writes.EncodedBatch], window: int,
        stats: StreamStats | None = None,
    ) -> AsyncIterator[Committed]:
        """Commit encoded batches, yielding one `Committed` per atomic script call, in order,
        with up to `window` calls in flight: the next batch is taken from `batches` (and
        encoded by it) while Redis runs the ones sent before (`writes.commit_stream`)."""
        shards = await self.shards_to_commit()
        async for committed in writes.commit_stream(shards, batches, window, self.key_in, stats):
            yield committed

    async def commit_batches(self, batches: Sequence[writes.Batch]) -> list[Committed]:
        """Commit each batch atomically under its key, in order, on an ordered bucket (a batch
        over several shards of a bucket in a Redis Cluster is not one atomic call: use
        `commit_many`); a batch whose key is already known is not written again (`fresh`
        False). Small consecutive batches go several to a script call (`writes.commit_batches`),
        up to WINDOW calls of a full BATCH in flight.

        Every change is validated before anything is sent. Raises BucketUnavailable when
        nothing was sent, CommitOutcomeUnknown when the calls were sent but no answer came: some
        or all of them may be in the bucket (send them again with the same keys to find out).
        """
        shard = self.ordered_shard()
        for changes, _ in batches:
            for change in changes:
                self.validator.validate(change)
        return await writes.commit_batches(shard, batches)

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
        return await self.ordered_shard().retention()

    async def head(self) -> Vector | None:
        """The bucket's head: every shard's (None before the bucket has an epoch)."""
        epoch = await self.current_epoch()
        if epoch is None:
            return None
        return self.vector(epoch, [r.head for r in await self.retentions()])

    # --- reading the log -----------------------------------------------------------------

    async def read(
        self, after: StreamId, until: StreamId | None = None, count: int = 1000
    ) -> list[LogEntry]:
        """Entries of an ordered bucket after `after` (exclusive) up to `until` (inclusive),
        oldest first (`Shard.read` for any bucket)."""
        return await self.ordered_shard().read(after, until, count)

    async def read_newest(
        self, before: StreamId | None, after: StreamId | None, count: int
    ) -> list[LogEntry]:
        """The newest entries of an ordered bucket older than `before` and newer than `after`
        (both exclusive, None: no bound), newest first."""
        return await self.ordered_shard().read_newest(before, after, count)

    async def read_partitions(
        self, after: Mapping[int, StreamId], count: int
    ) -> tuple[dict[int, list[LogEntry]], dict[int, StreamId], set[str | None]]:
        """Up to `count` entries of each partition in `after` after its position, oldest first,
        the head of each one's shard at the same instant (one snapshot per shard), and the
        epochs the shards read had then (one, unless it changed meanwhile)."""
        by_shard: dict[int, tuple[Shard, dict[int, int]]] = {}
        for partition in after:
            shard, local = await self.locate(partition)
            by_shard.setdefault(shard.index, (shard, {}))[1][local] = partition
        reads = await asyncio.gather(*(
            shard.read_partitions({local: after[p] for local, p in locals_.items()}, count)
            for shard, locals_ in by_shard.values()
        ))
        entries: dict[int, list[LogEntry]] = {}
        heads: dict[int, StreamId] = {}
        for (_, locals_), (read, head, _) in zip(by_shard.values(), reads, strict=True):
            for local, p in locals_.items():
                entries[p] = read[local]
                heads[p] = head
        return {p: entries[p] for p in after}, heads, {epoch for _, _, epoch in reads}

    async def tail(self, after: StreamId, block_ms: int | None, count: int = 1000) -> LogRead:
        """The tail read of an ordered bucket (`Shard.tail`: each shard's for any bucket)."""
        return await self.ordered_shard().tail(after, block_ms, count)

    def abandon_reads(self) -> None:
        """End a blocking tail read in progress now, and any later one, as `BucketUnavailable`
        before anything is sent: their reader is stopping (`Tail.stop`)."""
        for shard in self._shards:
            shard.abandon_reads()

    async def trim(self, max_age: float | None, max_items: int | None = None) -> int:
        """Remove items older than `max_age` seconds (Redis' clock) and the oldest beyond
        `max_items`, across every partition (each shard of a bucket in a Redis Cluster to its
        share, max_items / partitions rounded up), and forget the idempotency keys older than
        `max_age`. Returns how many items were removed."""
        shards = await self.shards()
        share = None if max_items is None else -(-max_items // len(shards))
        removed = await asyncio.gather(*(shard.trim(max_age, share) for shard in shards))
        return sum(removed)

    # --- reading the store ---------------------------------------------------------------

    async def states(self, resource: str, ids: Sequence[str]) -> list[bytes | None]:
        """The stored states of `ids` (JSON bytes, None where none is stored), in order."""
        shards = await self.shards()
        if len(shards) == 1:
            return await shards[0].states(resource, ids)
        out: list[bytes | None] = []
        for id in ids:
            out += await shards[partition_of(id, len(shards))].states(resource, [id])
        return out

    async def stored_resources(self) -> list[str]:
        """The resources with a stored state in the bucket (their index exists), sorted."""
        found: set[str] = set()
        for shard in await self.shards():
            found.update(await shard.stored_resources())
        return sorted(found)

    async def page_pieces(self, resource: str, pieces: Sequence[Piece], limit: int) -> StatePage:
        """Up to `limit` stored states of `resource` whose ids are in `pieces` (ids and ranges of
        the index, in id order), with the bucket head: each shard's part and head are one
        snapshot (one round trip), merged by id over the shards."""
        shards = await self.shards()
        pages = await asyncio.gather(*(s.page_pieces(resource, pieces, limit) for s in shards))
        epochs = {epoch for _, epoch, _ in pages}
        cursor: Position | None = None
        if len(epochs) == 1 and None not in epochs:
            cursor = self.vector(cast(str, epochs.pop()), [head for _, _, head in pages])
        if len(pages) == 1:
            return StatePage(pages[0][0].ids, pages[0][0].states, cursor)
        rows = sorted(
            ((id.encode(), id, state) for page, _, _ in pages
             for id, state in zip(page.ids, page.states, strict=True)),
            key=lambda row: row[0],
        )[:limit]
        return StatePage([r[1] for r in rows], [r[2] for r in rows], cursor)

    async def get(self, resource: str, id: str) -> bytes | None:
        """The stored state of one resource object as JSON bytes, or None."""
        return await (await self.shard_of(id)).get(resource, id)

    async def wait_for_replicas(self, replicas: int, timeout: float) -> list[int]:
        """Each shard's count of replicas having every write its master acknowledged before
        this call, waiting up to `timeout` seconds for `replicas` (`Shard.wait_for_replicas`)."""
        shards = await self.shards()
        return list(await asyncio.gather(
            *(s.wait_for_replicas(replicas, timeout) for s in shards)))

    async def aclose(self) -> None:
        """Drop the connections the shards keep (not the client's pool)."""
        for shard in self._shards:
            await shard.aclose()


__all__ = ["IDEMPOTENCY_KEYS", "Log"]
