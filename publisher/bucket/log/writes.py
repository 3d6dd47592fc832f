"""The commits of a `Log`, each written once over its shards (a single Redis being one shard):
the changes split by shard, each shard's part committed atomically by its `Committer`
(`publisher.bucket.log.commits`), the outcome of a commit over several shards.

A shard's part is committed under the commit's idempotency key as that shard names it
(`Log.key_in`: the key itself in a single Redis, `key/<partition>` in a Redis Cluster); the
parts of several shards run concurrently, and when some fail after others were written the
error says which (`CommitOutcomeUnknown` or the refusal's kind).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import TypeVar

from changefeed.cursor import Position, StreamId
from changefeed.errors import BucketUnavailable, ChangefeedError, CommitOutcomeUnknown
from publisher.bucket.log.commits import CommitCall, StreamStats
from publisher.bucket.log.shard import Shard
from publisher.bucket.values.changes import (
    Change,
    Committed,
    Encoded,
    PackedChanges,
    pack_change_values,
    pack_changes,
    pack_group,
)
from publisher.bucket.values.keys import partition_of

BATCH = 500
"""Changes per Lua call in commit_many: keeps Redis responsive between calls."""
WINDOW = 4
"""Script calls commit_many and commit_batches keep in flight on their connection: Redis runs
one while the writer packs the next and reads the answers before it, so neither waits for the
other."""

Batch = tuple[Sequence[Change], str | None]
"""Changes committed atomically by one script call, and the call's idempotency key (or None)."""
KeyIn = Callable[[str, int], str]
"""The idempotency key under which shard s commits its part of a commit under a key
(`Log.key_in`)."""
KeyOf = Callable[[str], str | None]
"""The idempotency key of an encoded batch, given the digest of its changes (or None: no key)."""
EncodedBatch = tuple[Sequence[Encoded], KeyOf]
"""Encoded changes committed atomically by one script call, and how to name the call's key."""

T = TypeVar("T")


def split(ids: Sequence[str], shards: int) -> dict[int, list[int]]:
    """The numbers of the changes (of resource ids `ids`) each shard gets, shards in order."""
    if shards == 1:
        return {0: list(range(len(ids)))}
    by_shard: dict[int, list[int]] = {}
    for number, id in enumerate(ids):
        by_shard.setdefault(partition_of(id, shards), []).append(number)
    return dict(sorted(by_shard.items()))


def _call(packed: PackedChanges, key: str) -> CommitCall:
    return packed, key, packed.digest() if key else ""


async def _on_shards(order: list[int], parts: Sequence[Awaitable[T]]) -> list[T]:
    """Await the parts of a commit (one per shard of `order`), concurrently; raise what the
    commit tells if some failed (one part: its error as it is)."""
    if len(parts) == 1:
        return [await parts[0]]
    results = await asyncio.gather(*parts, return_exceptions=True)
    failed = {p: r for p, r in zip(order, results, strict=True) if isinstance(r, BaseException)}
    if failed:
        for error in failed.values():
            if not isinstance(error, Exception):
                raise error  # cancelled, interrupted: not a commit's outcome
        written = [p for p in order if p not in failed]
        raise _outcome_error(len(order), written, failed) from next(iter(failed.values()))
    return results  # type: ignore[return-value]


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


async def _run(shard: Shard, calls: Iterator[CommitCall], count: int,
               take: Callable[[Committed], None] | None = None,
               window: int = WINDOW) -> list[Committed]:
    """Run `count` calls on `shard` in order: one alone, more with up to `window` in flight (the
    next packed while Redis runs the ones before); `take` is given each answer as it comes,
    while Redis runs the calls after it."""
    if count == 1:
        done = [await shard.commits.commit_one(*next(calls))]
        if take is not None:
            take(done[0])
        return done
    done = []
    async for committed in shard.commits.commit_calls(calls, window):
        if take is not None:
            take(committed)
        done.append(committed)
    return done


async def commit_many(
    shards: Sequence[Shard], changes: Sequence[Change], key: str | None, key_in: KeyIn
) -> tuple[list[str], str | None]:
    """Commit validated `changes` atomically per shard and per batch of BATCH, in order;
    returns their cursors (`ChangeBucket.commit_many`) and, when a shard of several found the
    bucket rolled back and started a new epoch, that epoch (the bucket's to renew). With an
    idempotency `key`, shard s's batch n is committed under `key_in(key, s)` (n = 0) or that
    followed by `#n`."""
    if not changes:
        return [], None
    n = len(shards)
    by_shard: dict[int, Sequence[int]] = (
        {0: range(len(changes))} if n == 1
        else dict(split([c.changed_resource_id for c in changes], n))
    )
    cursors: list[str] = [] if n == 1 else [""] * len(changes)

    def calls(s: int, numbers: Sequence[int]) -> Iterator[CommitCall]:
        name = key_in(key, s) if key is not None else ""
        for batch, start in enumerate(range(0, len(numbers), BATCH)):
            chunk = (changes[start : start + BATCH] if n == 1  # the changes in order: a slice
                     else [changes[i] for i in numbers[start : start + BATCH]])
            yield _call(pack_change_values(chunk), f"{name}#{batch}" if batch and name else name)

    def taker(s: int, numbers: Sequence[int]) -> Callable[[Committed], None]:
        """What gives the changes of shard `s` their cursors, one answer at a time."""
        if n == 1:  # one position: the changes are in order, their cursors a run
            return lambda c: cursors.extend(Position.run(c.epoch, c.ms, c.first, c.count))
        each = iter(numbers)

        def take(c: Committed) -> None:
            for offset in range(c.count):
                cursors[next(each)] = Position.at(
                    c.epoch, n, s, StreamId(c.ms, c.first + offset))
        return take

    order = list(by_shard)
    done = await _on_shards(order, [
        _run(shards[s], calls(s, by_shard[s]), -(-len(by_shard[s]) // BATCH),
             taker(s, by_shard[s]))
        for s in order
    ])
    renewed = [c.epoch for part in done for c in part if c.renewed and n > 1]
    return cursors, renewed[0] if renewed else None


def _parts(
    batches: Iterator[EncodedBatch], shards: int, key_in: KeyIn
) -> Iterator[tuple[list[int], list[CommitCall]]]:
    """Each batch of `batches` split by shard: the shards it goes to and each one's call, under
    the batch's key (`key_of` of the digest of the whole batch) as the shard names it."""
    for changes, key_of in batches:
        packed = pack_changes(changes)
        key = key_of(packed.digest()) or ""
        if shards == 1:
            yield [0], [_call(packed, key)]
            continue
        by_shard = split([change[2] for change in changes], shards)
        yield list(by_shard), [
            _call(pack_changes([changes[i] for i in numbers]), key_in(key, s))
            for s, numbers in by_shard.items()
        ]


async def commit_stream(
    shards: Sequence[Shard], batches: Iterator[EncodedBatch], window: int, key_in: KeyIn,
    stats: StreamStats | None = None,
) -> AsyncIterator[Committed]:
    """Commit encoded batches, yielding one `Committed` per atomic script call, in order.

    The changes are not validated here: the caller built them checked. The key of a batch is
    `key_of(digest)`, the digest being that of its encoded changes. Each batch is split by
    shard (`_parts`); on one shard up to `window` calls are in flight: the next batch is taken
    from `batches` (and encoded by it) while Redis runs the ones sent before. When `batches`
    raises, the calls already sent are answered (and yielded) first, then the error is raised;
    a reply with an error is raised once every call sent before it is yielded. Over several
    shards (a Redis Cluster) a batch's parts run concurrently and the batches in order, one
    `Committed` per part.
    """
    stats = stats if stats is not None else StreamStats()
    parts = _parts(batches, len(shards), key_in)
    if len(shards) == 1:
        calls = (part_calls[0] for _, part_calls in parts)
        async for committed in shards[0].commits.commit_calls(calls, window, stats):
            yield committed
        return
    for order, part_calls in parts:
        started = time.perf_counter()
        results = await _on_shards(order, [
            shards[s].commits.commit_one(*call) for s, call in zip(order, part_calls, strict=True)
        ])
        stats.waited(time.perf_counter() - started, len(order))
        for result in results:
            yield result


async def commit_batches(shard: Shard, batches: Sequence[Batch]) -> list[Committed]:
    """Commit each batch of validated changes atomically under its key, in order, on the one
    shard of an ordered bucket (`Log.commit_batches`); one `Committed` per batch. Consecutive
    small batches go together, up to BATCH changes, as one script call that applies each under
    its own key (`pack_group`: a batch whose key is known is skipped, the others written); a
    larger batch is a call of its own. Up to WINDOW calls of a full BATCH are in flight, more
    of smaller ones (as many changes in flight at most)."""
    calls: list[CommitCall] = []
    sizes: list[int] = []
    """Per call, how many batches it holds (0: one, as a plain call)."""
    group: list[tuple[PackedChanges, str]] = []
    held = 0

    def close_group() -> None:
        nonlocal group, held
        if len(group) == 1:
            calls.append(_call(*group[0]))
            sizes.append(0)
        elif group:
            calls.append((pack_group(group), "", ""))
            sizes.append(len(group))
        group, held = [], 0

    for changes, key in batches:
        packed = pack_change_values(changes)
        if held + packed.count > BATCH:
            close_group()
        group.append((packed, key or ""))
        held += packed.count
    close_group()
    largest = max((call[0].count for call in calls), default=1)
    window = max(WINDOW, WINDOW * BATCH // max(1, largest))
    done = await _run(shard, iter(calls), len(calls), window=window)
    out: list[Committed] = []
    for committed, size in zip(done, sizes, strict=True):
        out += committed.parts if size else [committed]
    return out


__all__ = ["BATCH", "WINDOW", "Batch", "EncodedBatch", "KeyIn", "KeyOf", "commit_batches",
           "commit_many", "commit_stream", "split"]
