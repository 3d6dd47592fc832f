"""The commit path of a `ChangeBucket`: commits split by shard, each shard's atomic script
calls (`publisher.bucket.commits`), the outcome of a commit over several shards, and the wait for
replicas."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any

from changefeed.cursor import CompositeCursor, StreamId
from changefeed.errors import (
    BucketUnavailable,
    ChangefeedError,
    CommitOutcomeUnknown,
    ReplicationTimeout,
)
from publisher.bucket.commits import CommitCall, Committer, StreamStats
from publisher.bucket.core import BucketCore
from publisher.bucket.keys import partition_of
from publisher.bucket.shard import Shard
from publisher.bucket.values import (
    Change,
    Committed,
    Encoded,
    PackedChanges,
    encode_change,
    pack_changes,
)

BATCH = 500
"""Changes per Lua call in commit_many: keeps Redis responsive between calls."""
REPLICAS_TIMEOUT = 2.0
"""Seconds `commit(..., replicas=N)` waits for the replicas by default."""
WINDOW = 4
"""Script calls commit_many and commit_batches keep in flight on their connection: Redis runs
one while the writer packs the next and reads the answers before it, so neither waits for the
other."""

Batch = tuple[Sequence[Change], str | None]
"""Changes committed atomically by one script call, and the call's idempotency key (or None)."""
KeyOf = Callable[[str], str | None]
"""The idempotency key of an encoded batch, given the digest of its changes (or None: no key)."""
EncodedBatch = tuple[Sequence[Encoded], KeyOf]
"""Encoded changes committed atomically by one script call, and how to name the call's key."""


def _outcome_error(
    total: int, written: list[int], failed: dict[int, BaseException]
) -> ChangefeedError:
    """What a commit over several shards tells when some failed: which partitions were
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



class BucketWrites(BucketCore):
    """Commits: `commit`, `commit_many`, `commit_replicated`, `commit_stream`, `publish`..."""

    def commit_arguments(
        self, changes: Sequence[Change], key: str | None = None
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of commit.lua for `changes` (validated) on an ordered bucket, under
        idempotency `key`: for a client that passes them one by one (commits go through
        `commit_many`, packed)."""
        return self._shard().commits.arguments(self._pack(changes), key)

    committed = staticmethod(Committer.committed)

    @classmethod
    def cursors_of(cls, reply: bytes) -> list[str]:
        """The cursors of commit.lua's reply."""
        return cls.committed(reply).cursors

    async def commit_batches(self, batches: Sequence[Batch]) -> list[Committed]:
        """Commit each batch atomically (one script call each, up to WINDOW in flight), in
        order, on an ordered bucket (a batch over several shards of a bucket in a Redis Cluster
        is not one atomic call: use `commit_many`); a batch whose key is already known is not
        written again (`fresh` False).

        Every change is validated before anything is sent. Raises BucketUnavailable when nothing
        was sent, CommitOutcomeUnknown when the calls were sent but no answer came: some or all
        of them may be in the bucket (send them again with the same keys to find out).
        """
        commits = self._shard().commits
        calls = [
            (packed, key or "", packed.digest() if key else "")
            for packed, key in ((self._pack(changes), key) for changes, key in batches)
        ]
        if len(calls) == 1:
            return [await commits.commit_one(*calls[0])]
        return [committed async for committed in commits.commit_calls(iter(calls), WINDOW)]

    async def commit_stream(
        self, batches: Iterator[EncodedBatch], window: int, stats: StreamStats | None = None
    ) -> AsyncIterator[Committed]:
        """Commit encoded batches, yielding one `Committed` per atomic script call, in order,
        with up to `window` calls in flight: the next batch is taken from `batches` (and
        encoded by it) while Redis runs the ones sent before.

        The key of a batch is `key_of(digest)`, the digest being that of its encoded changes.
        The changes are not validated here: the caller built them checked. When `batches` raises,
        the calls already sent are answered (and yielded) first, then the error is raised; a
        reply with an error is raised once every call sent before it is yielded. On a bucket in
        a Redis Cluster each batch is split by shard and each part committed atomically under
        the batch's key followed by `/<partition>` (the parts of a batch concurrently, the
        batches in order; `window` is not used), one `Committed` per part.
        """
        if self.sharded:
            async for committed in self._commit_stream_sharded(batches, stats):
                yield committed
            return

        def calls() -> Iterator[CommitCall]:
            for changes, key_of in batches:
                packed = pack_changes(changes)
                digest = packed.digest()
                key = key_of(digest) or ""
                yield packed, key, digest if key else ""

        async for committed in self._shard().commits.commit_calls(calls(), window, stats):
            yield committed

    async def _commit_stream_sharded(
        self, batches: Iterator[EncodedBatch], stats: StreamStats | None
    ) -> AsyncIterator[Committed]:
        stats = stats if stats is not None else StreamStats()
        shards = await self.shards()
        await self._epoch()
        n = len(shards)
        for changes, key_of in batches:
            key = key_of(pack_changes(changes).digest()) or ""
            split: dict[int, list[Encoded]] = {}
            for change in changes:
                split.setdefault(partition_of(change[2], n), []).append(change)
            order = sorted(split)
            started = time.perf_counter()
            results = await asyncio.gather(
                *(self._commit_part(shards[p], pack_changes(split[p]),
                                    f"{key}/{p}" if key else "") for p in order),
                return_exceptions=True,
            )
            stats.redis_seconds += time.perf_counter() - started
            stats.batches += len(order)
            self._raise_failed(order, results)
            for result in results:
                assert isinstance(result, Committed)
                yield result

    @staticmethod
    async def _commit_part(shard: Shard, packed: PackedChanges, key: str) -> Committed:
        return await shard.commits.commit_one(packed, key, packed.digest() if key else "")

    @staticmethod
    def _raise_failed(order: list[int], results: Sequence[Any]) -> None:
        """Raise what a commit over the partitions `order` (one result each) tells, if any
        failed."""
        failed = {p: r for p, r in zip(order, results, strict=True)
                  if isinstance(r, BaseException)}
        if not failed:
            return
        for error in failed.values():
            if not isinstance(error, Exception):
                raise error  # cancelled, interrupted: not a commit's outcome
        written = [p for p in order if p not in failed]
        raise _outcome_error(len(order), written, failed) from next(iter(failed.values()))

    async def commit_many(self, changes: Iterable[Change], *, key: str | None = None) -> list[str]:
        """Commit changes atomically per batch of BATCH, in order; returns their cursors.

        Every change is validated before anything is sent; each batch is then encoded while
        Redis runs the ones before it (up to WINDOW in flight), so a state that orjson cannot
        encode fails its batch, after the batches before it are in. With an idempotency `key`,
        batch n of the call is committed under `key` (n = 0) or `key#n`: a call retried with the
        same key and the same changes writes only the batches that did not get in, and returns
        every change's original cursor.

        >>> cursors = await bucket.commit_many([Change.put("vm", id, ["nic"], state)], key=k)
        """
        changes = list(changes)
        changes = list(changes)
        for change in changes:
            self.validate(change)
        if not changes:
            return []
        if self.sharded:
            return await self._commit_many_sharded(changes, key)
        commits = self._shard().commits
        if len(changes) <= BATCH:
            packed = pack_changes([encode_change(change) for change in changes])
            done = await commits.commit_one(packed, key or "", packed.digest() if key else "")
            return done.cursors

        def calls() -> Iterator[CommitCall]:
            for number, start in enumerate(range(0, len(changes), BATCH)):
                packed = pack_changes([encode_change(c) for c in changes[start : start + BATCH]])
                if key is None:
                    yield packed, "", ""
                else:
                    yield packed, key if number == 0 else f"{key}#{number}", packed.digest()

        cursors: list[str] = []
        async for committed in commits.commit_calls(calls(), WINDOW):
            cursors += committed.cursors
        return cursors

    async def _commit_many_sharded(self, changes: list[Change], key: str | None) -> list[str]:
        """`commit_many` over shards: one atomic commit per shard (per batch of BATCH changes
        of a partition), the shards concurrently. With an idempotency `key`, partition p's batch
        n is committed under `key/p` (n = 0) or `key/p#n`, so a retry with the same key and
        changes writes only what is missing."""
        shards = await self.shards()
        await self._epoch()  # the shards get the bucket's epoch if theirs is missing
        n = len(shards)
        by_partition: dict[int, list[int]] = {}
        for number, change in enumerate(changes):
            by_partition.setdefault(partition_of(change.changed_resource_id, n), []).append(number)
        cursors: list[str] = [""] * len(changes)

        async def one(p: int, numbers: list[int]) -> list[Committed]:
            done = []
            for batch, start in enumerate(range(0, len(numbers), BATCH)):
                chunk = numbers[start : start + BATCH]
                batch_key = "" if key is None else f"{key}/{p}" + (f"#{batch}" if batch else "")
                packed = self._pack([changes[i] for i in chunk])
                committed = await self._commit_part(shards[p], packed, batch_key)
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
        self._raise_failed(order, results)
        renewed = [c for r in results if not isinstance(r, BaseException) for c in r if c.renewed]
        if renewed:
            # A shard's head was behind what this client had been acknowledged: the bucket
            # (not only the shard) starts a new epoch.
            await self.renew_epoch(renewed[0].epoch)
        return cursors

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
        written = {id(s): s for s in [await self.shard_of(c.changed_resource_id)
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
        shards = await self.shards()
        counts = await asyncio.gather(*(s.wait_for_replicas(replicas, timeout) for s in shards))
        return min(counts)

    async def publish(
        self, resource: str, id: str, sub_resources: Sequence[str], *, key: str | None = None
    ) -> str:
        """Append a change item only (the service's store lives elsewhere). Returns the cursor."""
        return (await self.commit_many([Change.publish(resource, id, sub_resources)], key=key))[0]

    async def publish_many(
        self, changes: Iterable[tuple[str, str, Sequence[str]]], *, key: str | None = None
    ) -> list[str]:
        return await self.commit_many((Change.publish(r, i, s) for r, i, s in changes), key=key)



__all__ = ["BATCH", "REPLICAS_TIMEOUT", "WINDOW", "Batch", "BucketWrites", "EncodedBatch",
           "KeyOf"]
