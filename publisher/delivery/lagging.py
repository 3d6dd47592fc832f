"""The connections that are not live: catching up from the window in a task of their own, or,
registered with `coalesce`, switched to a coalesced catch-up (publisher.delivery.coalesce) just
before the window would move past them. No I/O: the hub closes whom it names and runs the
catch-up tasks (publisher.delivery.replay).
"""

from __future__ import annotations

import structlog

from changefeed.cursor import StreamId
from publisher.delivery.coalesce import CoalesceOverflow
from publisher.delivery.counters import Counters
from publisher.delivery.subscribers import Subscriber
from publisher.delivery.window import Window, WindowEntry

log = structlog.get_logger(__name__)


class Lagging:
    """Who is behind the fan-out, and who of them coalesces."""

    def __init__(self, coalesce_ids: int, counters: Counters) -> None:
        self.coalesce_ids = coalesce_ids
        """The bound of a coalesced catch-up's set (`limits.coalesceIds`)."""
        self._counters = counters
        self._lagging: set[Subscriber] = set()
        """Catching up from the window: closed as slow when it moves past them."""
        self._coalescible: set[Subscriber] = set()
        """Lagging connections registered with `coalesce`, catching up from the window: each
        is switched to a coalesced catch-up before the window moves past it."""

    def limit(self, coalesce_ids: int) -> None:
        """A reloaded `limits.coalesceIds`, for the catch-ups that start from now on."""
        self.coalesce_ids = coalesce_ids

    def fall_behind(self, conn: Subscriber, position: StreamId) -> None:
        """`conn` passed its send buffer after `position`: it catches up from there."""
        conn.fall_behind(position)
        self._lagging.add(conn)
        if conn.registration.coalesce and not conn.sse and not conn.replaying:
            self._coalescible.add(conn)

    def resume(self, conn: Subscriber, position: StreamId) -> None:
        """`conn` registered behind the window head (it replays, then catches up)."""
        conn.resume_at(position)
        self._lagging.add(conn)

    def go_live(self, conn: Subscriber) -> None:
        """`conn` caught up: written by the fan-out again."""
        conn.go_live()
        self.discard(conn)

    def discard(self, conn: Subscriber) -> None:
        self._lagging.discard(conn)
        self._coalescible.discard(conn)

    @staticmethod
    def fold(conn: Subscriber, entry: WindowEntry) -> bool:
        """Fold `entry` into `conn`'s coalesced catch-up; False when that passed its limit (the
        caller closes it once the batch is written)."""
        coalesced = conn.coalesced
        if conn.closing or coalesced is None:
            return True
        try:
            coalesced.fold(entry.resource, entry.sub_resources, entry.changed_resource_id,
                           entry.position, entry.cursor, entry.published)
        except CoalesceOverflow:
            return False
        return True

    def before_append(self, window: Window) -> list[Subscriber]:
        """The fan-out is about to append to `window`: when that drops its oldest entry, switch
        every coalescible connection not sent it yet to a coalesced catch-up holding what the
        window has for it. The ones whose set passed its limit at once: the caller closes them."""
        if not self._coalescible or len(window) < window.capacity:
            return []
        oldest = window.oldest()
        if oldest is None:
            return []
        overflowed = []
        for conn in [c for c in self._coalescible if c.position < oldest.position]:
            self.discard(conn)
            coalesced = conn.coalesce(self.coalesce_ids)
            self._counters.coalescing_started()
            try:
                for entry in window.after(conn.position):
                    if conn.wants(entry):
                        coalesced.fold(entry.resource, entry.sub_resources,
                                       entry.changed_resource_id, entry.position, entry.cursor,
                                       entry.published)
            except CoalesceOverflow:
                overflowed.append(conn)
                continue
            log.info(
                "slow consumer: coalesced catch-up",
                instance=conn.registration.instance,
                service=conn.registration.service,
                remote=conn.remote,
                ids=len(coalesced),
            )
        return overflowed

    def fallen(self, window: Window) -> list[Subscriber]:
        """The lagging connections `window` moved past (not those replaying from Redis)."""
        if not self._lagging:
            return []
        return [c for c in self._lagging if not c.replaying and not window.covers(c.position)]


__all__ = ["Lagging"]
