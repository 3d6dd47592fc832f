"""The reads of a `ChangeBucket`: the log (of an ordered bucket; any bucket's through its
shards), the store's pages and states, and trimming."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import cast

from changefeed.cursor import AnyCursor, CompositeCursor, Cursor, StreamId
from publisher.bucket.core import BucketCore
from publisher.bucket.shard import Shard
from publisher.bucket.values import (
    LogEntry,
    LogRead,
    Piece,
    StatePage,
)


class BucketReads(BucketCore):
    """Reads of the log and the store, and `trim`."""

    # --- reading the log -----------------------------------------------------------------

    async def read(
        self, after: StreamId, until: StreamId | None = None, count: int = 1000
    ) -> list[LogEntry]:
        """Entries of an ordered bucket after `after` (exclusive) up to `until` (inclusive),
        oldest first (`Shard.read` for any bucket)."""
        return await self._shard().read(after, until, count)

    async def read_newest(
        self, before: StreamId | None, after: StreamId | None, count: int
    ) -> list[LogEntry]:
        """The newest entries of an ordered bucket older than `before` and newer than `after`
        (both exclusive, None: no bound), newest first."""
        return await self._shard().read_newest(before, after, count)

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
        return await self._shard().tail(after, block_ms, count)

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

    async def states(self, resource: str, ids: Sequence[str]) -> list[bytes | None]:
        """The stored states of `ids` (JSON bytes, None where none is stored), in order."""
        if self.ordered:
            return await self._shards[0].states(resource, ids)
        out: list[bytes | None] = []
        for id in ids:
            out += await (await self.shard_of(id)).states(resource, [id])
        return out

    async def stored_resources(self) -> list[str]:
        """The resources with a stored state in the bucket (their index exists), sorted."""
        found: set[str] = set()
        for shard in await self.shards():
            found.update(await shard.stored_resources())
        return sorted(found)

    # --- reading the store ---------------------------------------------------------------

    async def page(self, resource: str, after_id: str | None, limit: int) -> StatePage:
        """Up to `limit` stored states of `resource` with ids after `after_id`, in id order."""
        start = "-" if after_id is None else "(" + after_id
        return await self.page_pieces(resource, [Piece(start, "+")], limit)

    async def page_pieces(self, resource: str, pieces: Sequence[Piece], limit: int) -> StatePage:
        """Up to `limit` stored states of `resource` whose ids are in `pieces` (ids and ranges of
        the index, in id order), with the bucket head: each shard's part and head are one
        snapshot (one round trip), merged by id over the shards."""
        shards = await self.shards()
        pages = await asyncio.gather(*(s.page_pieces(resource, pieces, limit) for s in shards))
        epochs = {epoch for _, epoch, _ in pages}
        cursor: AnyCursor | None = None
        if len(epochs) == 1 and None not in epochs:
            vector = self.vector(cast(str, epochs.pop()), [head for _, _, head in pages])
            cursor = (CompositeCursor(vector.epoch, vector.positions) if vector.composite
                      else Cursor(vector.epoch, vector.positions[0]))
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


__all__ = ["BucketReads"]
