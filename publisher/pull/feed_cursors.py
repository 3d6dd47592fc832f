"""Which cursor each partition of a feed request reads from (ZeroEventHub's cursor sets): the
request's own, or its consumer's stored set (for the feed, publisher.pull.polls)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from changefeed import feed
from changefeed.errors import CursorSetsFull, ParamError
from publisher.bucket import ChangeBucket

if TYPE_CHECKING:
    from publisher.config.settings import Feed as CursorSets


async def feed_cursors(
    bucket: ChangeBucket, request: feed.FeedRequest, partitions: int, cursorsets: CursorSets
) -> dict[int, str]:
    """The cursor of each partition a feed request reads from: its own, or its consumer's
    stored cursor set (`resume`), which it stores first when it names one. Raises ParamError
    (a partition count other than the bucket's, a stored set missing a partition) and
    CursorSetsFull."""
    if request.n != partitions:
        raise ParamError(
            f"n={request.n} but this feed has {partitions} partition(s): pass n={partitions} "
            "(the partition count is fixed when the bucket is created)"
        )
    cursors = dict(request.cursors)
    if request.resume:
        assert request.cursorset is not None and request.consumer is not None
        stored = await bucket.cursor_sets.load_cursors(
            request.consumer, request.cursorset, request.resume
        )
        missing = [str(p) for p, c in stored.items() if c is None]
        if missing:
            raise ParamError(
                f"cursorset {request.cursorset!r} of consumer {request.consumer!r} holds no "
                f"cursor for partition(s) {', '.join(missing)}"
            )
        cursors = {p: c for p, c in stored.items() if c is not None}
    elif request.cursorset is not None:
        assert request.consumer is not None
        saved = await bucket.cursor_sets.save_cursors(
            request.consumer,
            request.cursorset,
            cursors,
            max_age=cursorsets.cursor_set_max_age,
            most=cursorsets.max_cursor_sets,
        )
        if not saved:
            raise CursorSetsFull(request.consumer, cursorsets.max_cursor_sets)
    return cursors


__all__ = ["feed_cursors"]
