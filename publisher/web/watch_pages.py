"""Bootstrap pages narrowed by a watch: only the stored objects whose ids the watch sees.

A resource's ids are a sorted set in Redis (all scores 0, so ordered by bytes). An exact id is a
point of it; a prefix ``p`` is the point ``p`` plus the run ``[p/ .. (p0`` of ids under it (``0``
follows ``/`` in ASCII). Once the ids and prefixes covered by another prefix of the watch are
dropped, these pieces are disjoint, so ordered by where they start they yield their ids in id
order: `pieces` plans them (pure, with the keyset `after_id` already applied) and the bucket's
page script walks them (`ChangeBucket.page_pieces`), so a page and its cursor are one consistent
snapshot of the store, read in one round trip.
"""

from __future__ import annotations

from changefeed.watch import Watch, prefixes_of
from publisher.bucket import ChangeBucket, Piece, StatePage


def _after(start: str, after_id: str | None) -> str:
    """ZRANGEBYLEX's start for the run from `start` (inclusive), after `after_id`."""
    if after_id is not None and after_id >= start:
        return "(" + after_id
    return "[" + start


def pieces(watch: Watch, after_id: str | None = None) -> list[Piece]:
    """The points and runs of the index holding the ids `watch` sees after `after_id`, in id
    order. Python compares str by code point, which is UTF-8's byte order: Redis' order."""
    if watch.everything:
        return [Piece("-" if after_id is None else "(" + after_id, "+")]
    prefixes = set(watch.prefixes)

    def covered(id: str) -> bool:
        """True when a prefix of the watch, other than `id` itself, sees `id`."""
        return any(p in prefixes for p in prefixes_of(id) if p != id)

    points = {id for id in watch.ids | prefixes if not covered(id)}
    runs = [p for p in prefixes if not covered(p)]
    found = [(id, Piece(id)) for id in points if after_id is None or id > after_id]
    for prefix in runs:
        low, high = prefix + "/", prefix + "0"
        if after_id is None or after_id < high:
            found.append((low, Piece(_after(low, after_id), "(" + high)))
    return [piece for _, piece in sorted(found, key=lambda pair: pair[0])]


async def page_watched(
    bucket: ChangeBucket, resource: str, watch: Watch, after_id: str | None, limit: int
) -> StatePage:
    """Up to `limit` stored states of `resource` whose ids `watch` sees, after `after_id`, in id
    order, with the bucket head read in the same snapshot."""
    return await bucket.log.page_pieces(resource, pieces(watch, after_id), limit)


__all__ = ["Piece", "page_watched", "pieces"]
