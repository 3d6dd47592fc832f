"""Bootstrap pages narrowed by a watch: only the stored objects whose ids the watch sees.

A resource's ids are a sorted set in Redis (all scores 0, so ordered by bytes). An exact id is a
point of it; a prefix ``p`` is the point ``p`` plus the run ``[p/ .. (p0`` of ids under it (``0``
follows ``/`` in ASCII). Once the ids and prefixes covered by another prefix of the watch are
dropped, these pieces are disjoint, so ordered by where they start they yield their ids in id
order: `pieces` plans them (pure, with the keyset `after_id` already applied) and one Lua script
walks them, so a page is one consistent snapshot of the store, read in one round trip.
"""

from __future__ import annotations

from dataclasses import dataclass

from changefeed.watch import Watch, prefixes_of
from publisher.bucket import ChangeBucket, Page, translate_redis_errors


@dataclass(frozen=True, slots=True)
class Piece:
    """One id (`end` None) or a ZRANGEBYLEX range `start`..`end` of the index."""

    start: str
    end: str | None = None

    def arguments(self) -> list[str]:
        return ["id", self.start, ""] if self.end is None else ["range", self.start, self.end]


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


# KEYS: index, state. ARGV: limit, then (kind, a, b) per piece: ("id", id, "") or
# ("range", start, end). Returns {ids, states}: one consistent snapshot. Compares no strings itself
# (Lua's string order follows the server's locale; the plan is already in Redis' byte order).
PAGE_LUA = """
local limit = tonumber(ARGV[1])
local ids = {}
for i = 2, #ARGV, 3 do
  local left = limit - #ids
  if left <= 0 then break end
  if ARGV[i] == 'id' then
    if redis.call('ZSCORE', KEYS[1], ARGV[i + 1]) then ids[#ids + 1] = ARGV[i + 1] end
  else
    local run = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[i + 1], ARGV[i + 2], 'LIMIT', 0, left)
    for _, id in ipairs(run) do ids[#ids + 1] = id end
  end
end
local states = {}
if #ids > 0 then states = redis.call('HMGET', KEYS[2], unpack(ids)) end
return {ids, states}
"""


async def page_watched(
    bucket: ChangeBucket, resource: str, watch: Watch, after_id: str | None, limit: int
) -> Page:
    """Up to `limit` stored states of `resource` whose ids `watch` sees, after `after_id`, in id
    order. The page's cursor is the bucket head read before the page: no newer than the page."""
    cursor = await bucket.head_cursor()
    args: list[str | int] = [limit]
    for piece in pieces(watch, after_id):
        args += piece.arguments()
    if len(args) == 1:
        return Page([], [], cursor)
    script = bucket.redis.register_script(PAGE_LUA)
    async with translate_redis_errors("page"):
        ids, states = await script(
            keys=[bucket.keys.index(resource), bucket.keys.state(resource)], args=args
        )
    return Page([i.decode() for i in ids], list(states), cursor)


__all__ = ["Piece", "page_watched", "pieces"]
