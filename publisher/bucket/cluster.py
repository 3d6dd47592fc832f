"""A bucket spread over a Redis Cluster: one hash tag per partition.

A bucket of `n` partitions in a cluster is `n` single-partition logs, each under its own hash tag
``{name/p}`` (``{name/p}:log``, ``:last``, ``:trimmed``, ``:epoch``, ``:idem``,
``:state:<resource>``, ``:index:<resource>``: the layout of `Keys`), so one partition's commit,
tail read, trim and page touch one slot, and the partitions land on the cluster's masters by
their slots. What belongs to the whole bucket stays under ``{name}``: its epoch, its partition
count, the fleet's reports, the feed's cursor sets and the Spark ledgers.

Every script of the single-instance bucket runs unchanged on a partition (`PartitionBucket` is a
`ChangeBucket` of one partition whose commits go through the cluster client). What differs:

- a commit whose changes fall in several partitions is one atomic commit per partition (sent
  concurrently); atomicity and order are per partition, as in every partitioned log. When one
  fails after another was written, `CommitOutcomeUnknown` (or `BucketUnavailable`) says which
  partitions were written; retry with the same idempotency key;
- idempotency keys are remembered per partition (the key names the call's changes of that
  partition);
- positions are composite (`changefeed.cursor.CompositeCursor`): a commit returns, for each
  change, the cursor of its one position in its partition;
- the bucket's epoch lives in ``{name}:epoch``; each partition holds a copy in
  ``{name/p}:epoch`` that its scripts check (a partition whose keys were lost gets the bucket's
  epoch back when it is next written, and its rollback is seen by the tails).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any, cast

import redis.exceptions
from redis.asyncio.cluster import RedisCluster

from changefeed.cursor import CompositeCursor, StreamId, new_epoch
from changefeed.errors import (
    BucketUnavailable,
    ChangefeedError,
    CommitOutcomeUnknown,
)
from changefeed.protocol import Resource
from publisher.bucket import scripts
from publisher.bucket.client import (
    BATCH,
    IDEMPOTENCY_KEYS,
    ChangeBucket,
    EncodedBatch,
    StreamStats,
    connect,
    translate_redis_errors,
)
from publisher.bucket.cluster_client import connect_cluster
from publisher.bucket.keys import partition_of
from publisher.bucket.values import (
    Change,
    Committed,
    Encoded,
    LogRead,
    PackedChanges,
    Piece,
    Retention,
    StatePage,
    pack_changes,
    unpack_bulk,
)


class PartitionBucket(ChangeBucket):
    """One partition of a cluster bucket: a single-partition bucket under the tag {name/p},
    whose new epoch (when its keys are created) is the whole bucket's."""

    def __init__(
        self, client: RedisCluster, name: str, partition: int,
        resources: Iterable[Resource] | None, idempotency_keys: int,
    ) -> None:
        self._bucket_epoch = new_epoch()
        super().__init__(
            cast(Any, client), f"{name}/{partition}", resources, 1,
            idempotency_keys=idempotency_keys,
        )
        self.partition = partition
        self._commit_script = client.register_script(scripts.COMMIT.text)

    @property
    def _candidate(self) -> str:
        """The epoch commit.lua gives the partition if its keys are missing: the bucket's."""
        return self._bucket_epoch

    @_candidate.setter
    def _candidate(self, value: str) -> None:
        """ChangeBucket draws a fresh candidate after some commits; a partition never does."""

    async def tail(self, after: StreamId, block_ms: int | None, count: int = 1000) -> LogRead:
        """`ChangeBucket.tail` in two steps: a cluster client does not pipeline scripts, so the
        XREAD BLOCK that waits is sent first, and the tail script, which reads and checks, once
        it returned (one round trip more per wake than on a single Redis)."""
        if block_ms is not None:
            async with translate_redis_errors("tail"):
                await self.redis.xread({self.keys.log: str(after)}, count=1, block=block_ms)
        return await super().tail(after, None, count)

    async def commit_call(self, changes: Sequence[Change], key: str | None) -> Committed:
        """One atomic commit.lua call of `changes` (validated, all of this partition)."""
        keys, args = self.commit_arguments(changes, key)
        async with translate_redis_errors(f"commit (partition {self.partition})", sent=True):
            reply = await self._commit_script(keys=keys, args=args)
        return self._answered(reply)

    async def commit_packed(self, packed: PackedChanges, key: str) -> Committed:
        """One atomic commit.lua call of changes packed already (all of this partition)."""
        keys = [*self.keys.common, *self.keys.idempotency_pair]
        for resource in packed.resources:
            keys += [self.keys.state(resource), self.keys.index(resource)]
        args: list[Any] = [
            self._candidate, 1, key, packed.digest() if key else "", self.idempotency_keys,
            self._witness_argument(), *unpack_bulk(packed.args),
        ]
        async with translate_redis_errors(f"commit (partition {self.partition})", sent=True):
            reply = await self._commit_script(keys=keys, args=args)
        return self._answered(reply)


def _outcome_error(
    total: int, written: list[int], failed: dict[int, BaseException]
) -> ChangefeedError:
    """What a commit over several partitions tells when some partitions failed: which were
    written, which may have been (CommitOutcomeUnknown), which were not. When every failure is
    known to have written nothing, the error is of the first failure's kind (ChangeError,
    PartitionMismatch, BucketUnavailable...), saying what the other partitions did."""
    unknown = sorted(p for p, e in failed.items() if isinstance(e, CommitOutcomeUnknown))
    refused = sorted(p for p, e in failed.items() if not isinstance(e, CommitOutcomeUnknown))
    first = failed[unknown[0] if unknown else refused[0]]
    said = (
        f"commit over {total} partition(s): written in partition(s) {written or 'none'}"
        + (f"; outcome unknown in {unknown}" if unknown else "")
        + (f"; not written in {refused}" if refused else "")
        + f" ({first}). A commit is atomic per partition in a Redis Cluster: commit again "
        "with the same idempotency key to write exactly what is missing"
    )
    if unknown:
        return CommitOutcomeUnknown(said, first)
    try:
        if isinstance(first, BucketUnavailable):
            return type(first)(said, first.cause)
        if isinstance(first, ChangefeedError):
            return type(first)(said)
    except TypeError:  # an error class that takes other arguments
        pass
    return ChangefeedError(said)


class ClusterBucket(ChangeBucket):
    """A bucket whose partitions spread over a Redis Cluster (see the module's docstring).

    Bucket-wide keys ({name}) are used through ChangeBucket's own methods (the fleet, cursor
    sets, Spark ledgers); the log and the store go to `parts`, one `PartitionBucket` each.

    >>> bucket = ClusterBucket(connect_cluster("redis+cluster://10.0.0.1:7000/"), "cf", rs, 8)
    >>> cursor = await bucket.commit("vm", vm_uuid, ["nic"], state, key=request_id)
    """

    def __init__(
        self,
        client: RedisCluster,
        name: str,
        resources: Iterable[Resource] | None = None,
        partitions: int | None = None,
        *,
        idempotency_keys: int = IDEMPOTENCY_KEYS,
    ) -> None:
        super().__init__(
            cast(Any, client), name, resources, partitions, idempotency_keys=idempotency_keys
        )
        self.cluster = client
        self._resources = list(resources) if resources is not None else None
        self._parts: list[PartitionBucket] = []
        self.epoch: str | None = None
        """The bucket's epoch, as last read or created (`ensure`)."""

    # --- the partitions --------------------------------------------------------------------

    async def parts(self) -> list[PartitionBucket]:
        """One PartitionBucket per partition (the count is the configured one, else the
        bucket's stored count, else 1)."""
        if not self._parts:
            n = self.partitions or await self._stored_partitions() or 1
            self._parts = [
                PartitionBucket(self.cluster, self.name, p, self._resources,
                                self.idempotency_keys)
                for p in range(n)
            ]
        return self._parts

    async def _stored_partitions(self) -> int | None:
        async with translate_redis_errors("partitions"):
            stored = await self.redis.get(self.keys.partitions)
        return int(stored) if stored is not None else None

    async def partition_count(self) -> int:
        return len(await self.parts())

    async def streams(self) -> list[str]:
        return [part.keys.log for part in await self.parts()]

    # --- the epoch -------------------------------------------------------------------------

    async def ensure(self) -> str:
        """The bucket's epoch, creating the bucket ({name}:epoch, :partitions) if it has none,
        and each partition's copy of the epoch where it is missing or stale."""
        parts = await self.parts()
        async with translate_redis_errors("epoch"):
            epoch, stored = await self._ensure(
                keys=self.keys.common, args=[new_epoch(), len(parts)]
            )
        epoch = epoch.decode()
        self._known_partitions = int(stored)
        await self._adopt(epoch)
        return str(epoch)

    async def _adopt(self, epoch: str) -> None:
        """Give every partition the bucket's epoch (created, or replaced after a renewal)."""
        self.epoch = epoch
        parts = await self.parts()
        for part in parts:
            part._bucket_epoch = epoch
        async with translate_redis_errors("epoch"):
            await asyncio.gather(*(self._adopt_one(part, epoch) for part in parts))

    async def _adopt_one(self, part: PartitionBucket, epoch: str) -> None:
        found, _ = await part._ensure(keys=part.keys.common, args=[epoch, 1])
        if found.decode() != epoch:
            await part.redis.set(part.keys.epoch, epoch)
            # The partition's history goes on under the bucket's epoch: a writer's witness of
            # the one it replaces is of an ancestor, not of a history it never held (commit.lua).
            await part.redis.lpush(part.keys.epochs, found)
            await part.redis.ltrim(part.keys.epochs, 0, 99)

    async def current_epoch(self) -> str | None:
        async with translate_redis_errors("epoch"):
            epoch: Any = await self.redis.get(self.keys.epoch)
        return epoch.decode() if epoch else None

    async def renew_epoch(self, known: str) -> str:
        """Start a new bucket epoch if it is still `known` (a partition rolled back), and give
        it to every partition; returns the bucket's epoch after it."""
        epoch = await super().renew_epoch(known)
        if epoch:
            await self._adopt(epoch)
        return epoch

    async def _epoch(self) -> str:
        return self.epoch if self.epoch is not None else await self.ensure()

    # --- writing ---------------------------------------------------------------------------

    async def commit_many(self, changes: Iterable[Change], *, key: str | None = None) -> list[str]:
        """Commit `changes`: one atomic commit per partition (per batch of BATCH changes of a
        partition), the partitions concurrently; returns each change's cursor, in order.

        With an idempotency `key`, partition p's batch n is committed under `key/p` (n = 0) or
        `key/p#n`, so a retry with the same key and changes writes only what is missing.
        """
        changes = list(changes)
        for change in changes:
            self.validate(change)
        if not changes:
            return []
        parts = await self.parts()
        await self._epoch()  # the partitions get the bucket's epoch if theirs is missing
        n = len(parts)
        by_partition: dict[int, list[int]] = {}
        for number, change in enumerate(changes):
            by_partition.setdefault(partition_of(change.changed_resource_id, n), []).append(number)
        cursors: list[str] = [""] * len(changes)

        async def one(p: int, numbers: list[int]) -> list[Committed]:
            done = []
            for batch, start in enumerate(range(0, len(numbers), BATCH)):
                chunk = numbers[start : start + BATCH]
                batch_key = None if key is None else f"{key}/{p}" + (f"#{batch}" if batch else "")
                committed = await parts[p].commit_call([changes[i] for i in chunk], batch_key)
                for offset, i in enumerate(chunk):
                    cursors[i] = CompositeCursor.at(
                        committed.epoch, n, p, StreamId(committed.ms, committed.first + offset)
                    )
                done.append(committed)
            return done

        order = sorted(by_partition)
        results = await asyncio.gather(
            *(one(p, by_partition[p]) for p in order), return_exceptions=True
        )
        failed = {p: r for p, r in zip(order, results, strict=True) if isinstance(r, BaseException)}
        if failed:
            for error in failed.values():
                if not isinstance(error, Exception):
                    raise error  # cancelled, interrupted: not a commit's outcome
            written = [p for p in order if p not in failed]
            raise _outcome_error(len(order), written, failed) from next(iter(failed.values()))
        renewed = [c for r in results if not isinstance(r, BaseException) for c in r if c.renewed]
        if renewed:
            # A partition's head was behind what this client had been acknowledged: the
            # bucket (not only the partition) starts a new epoch.
            await self.renew_epoch(renewed[0].epoch)
        return cursors

    async def commit_stream(
        self, batches: Iterator[EncodedBatch], window: int, stats: StreamStats | None = None
    ) -> AsyncIterator[Committed]:
        """`ChangeBucket.commit_stream` over partitions: each batch is split by partition and
        each part committed atomically (the parts of a batch concurrently, the batches in
        order), under the batch's key followed by `/<partition>`; yields one `Committed` per
        part, whose cursors are positions of that partition's log. `window` is not used: the
        parts of a batch are what is in flight."""
        stats = stats if stats is not None else StreamStats()
        parts = await self.parts()
        await self._epoch()
        n = len(parts)
        for changes, key_of in batches:
            whole = pack_changes(changes)
            key = key_of(whole.digest()) or ""
            split: dict[int, list[Encoded]] = {}
            for change in changes:
                split.setdefault(partition_of(change[2], n), []).append(change)
            order = sorted(split)
            started = time.perf_counter()
            results = await asyncio.gather(
                *(parts[p].commit_packed(pack_changes(split[p]), f"{key}/{p}" if key else "")
                  for p in order),
                return_exceptions=True,
            )
            stats.redis_seconds += time.perf_counter() - started
            stats.batches += len(order)
            failed = {p: r for p, r in zip(order, results, strict=True)
                      if isinstance(r, BaseException)}
            if failed:
                written = [p for p in order if p not in failed]
                raise _outcome_error(len(order), written, failed) from next(iter(failed.values()))
            for result in results:
                assert isinstance(result, Committed)
                yield result

    async def commit_batches(self, batches: Sequence[tuple[Sequence[Change], str | None]]
                             ) -> list[Committed]:
        raise ChangefeedError(
            "commit_batches: a bucket in a Redis Cluster commits per partition; use commit_many"
        )

    async def commit_replicated(
        self, changes: Iterable[Change], *, key: str | None = None, replicas: int = 0,
        timeout: float = 2.0,
    ) -> list[str]:
        if replicas > 0:
            raise ChangefeedError(
                "commit(..., replicas=N) is not supported for a bucket in a Redis Cluster yet"
            )
        return await self.commit_many(changes, key=key)

    # --- reading ---------------------------------------------------------------------------

    async def retentions(self) -> list[Retention]:
        """What each partition's log retains (its epoch copy, trimmed, head, oldest)."""
        parts = await self.parts()
        return list(await asyncio.gather(*(part.retention() for part in parts)))

    async def retention(self) -> Retention:
        raise ChangefeedError(
            "a bucket in a Redis Cluster has a retention per partition (retentions())"
        )

    async def head_cursor(self) -> CompositeCursor | None:  # type: ignore[override]
        """The bucket's head: each partition's head as a composite cursor."""
        epoch = await self.current_epoch()
        if epoch is None:
            return None
        retentions = await self.retentions()
        return CompositeCursor(epoch, tuple(r.head for r in retentions))

    async def page_pieces(self, resource: str, pieces: Sequence[Piece], limit: int) -> StatePage:
        """Up to `limit` states whose ids are in `pieces`, merged by id over the partitions'
        indexes; the cursor is each partition's head as it read its part of the page (each
        partition's part and head are one snapshot)."""
        parts = await self.parts()
        pages = await asyncio.gather(
            *(part.page_pieces(resource, pieces, limit) for part in parts)
        )
        rows = sorted(
            ((id.encode(), id, state) for page in pages
             for id, state in zip(page.ids, page.states, strict=True)),
            key=lambda row: row[0],
        )[:limit]
        epochs = {page.cursor.epoch for page in pages if page.cursor is not None}
        cursor = None
        if len(epochs) == 1 and all(page.cursor is not None for page in pages):
            cursor = CompositeCursor(
                epochs.pop(), tuple(cast(Any, page.cursor).position for page in pages)
            )
        return StatePage([r[1] for r in rows], [r[2] for r in rows], cast(Any, cursor))

    async def get(self, resource: str, id: str) -> bytes | None:
        parts = await self.parts()
        return await parts[partition_of(id, len(parts))].get(resource, id)

    async def states(self, resource: str, ids: Sequence[str]) -> list[bytes | None]:
        parts = await self.parts()
        out: list[bytes | None] = []
        for id in ids:
            out += await parts[partition_of(id, len(parts))].states(resource, [id])
        return out

    async def stored_resources(self) -> list[str]:
        found: set[str] = set()
        for part in await self.parts():
            found.update(await part.stored_resources())
        return sorted(found)

    async def trim(self, max_age: float | None, max_items: int | None = None) -> int:
        """Trim every partition (concurrently): by age, and each to its share of `max_items`
        (max_items / partitions, rounded up)."""
        parts = await self.parts()
        share = None if max_items is None else -(-max_items // len(parts))
        removed = await asyncio.gather(*(part.trim(max_age, share) for part in parts))
        return sum(removed)

    def partition_buckets(self) -> Iterator[PartitionBucket]:
        """The partitions made so far (after `parts()`), partition 0 first."""
        return iter(self._parts)

    async def aclose(self) -> None:
        await self.cluster.aclose()


def is_cluster_error(exc: BaseException) -> bool:
    """A Redis Cluster refusal that ran nothing (the cluster is down, a slot is not served)."""
    return isinstance(exc, (redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError,
                            redis.exceptions.SlotNotCoveredError))


__all__ = [
    "ClusterBucket",
    "PartitionBucket",
    "connect_cluster",
    "is_cluster_error",
    "open_bucket",
]


def open_bucket(
    url: str, name: str, resources: Iterable[Resource] | None = None,
    partitions: int | None = None,
) -> ChangeBucket:
    """A bucket client for any Redis URL: a `ClusterBucket` for `redis+cluster://`, else a
    `ChangeBucket` (plain Redis or Sentinel). For writers and readers that do not tail."""
    return ChangeBucket(connect(url), name, resources, partitions)


ChangeBucket.cluster_class = ClusterBucket
