"""What the hub reports of its connections: /changefeeds/stats registrations and the coalesced
catch-ups, read off the hub and the tail without changing them."""

from __future__ import annotations

import time
from typing import Any

from changefeed.cursor import ZERO, Position, StreamId
from publisher.delivery.hub import Hub
from publisher.delivery.tail import Tail


def coalescing(hub: Hub) -> dict[str, int]:
    """The coalesced catch-ups since start (`started`, `finished`, `items`, `sent`), and
    `listeners` in one now with `pending` ids between them (what they hold in memory)."""
    sets = [c.coalesced for c in hub.connections if c.coalesced is not None]
    return {**hub.counters.coalesced, "listeners": len(sets), "pending": sum(map(len, sets))}


def registrations(hub: Hub, tail: Tail, publisher_id: str) -> list[dict[str, Any]]:
    """One entry per registered (connection, resource), as /changefeeds/stats shows them.

    `itemsBehindHead` is what the connection may still be due: the matching window items
    after its position, plus every log item the tail has not read yet (of any kind: the
    tail cannot know which match before reading them). `headCursor` is the bucket's head.
    """
    head = None
    if hub.epoch:
        vector = hub.vector
        head = vector.with_positions(
            [max(h, at) for h, at in zip(tail.heads, vector.positions, strict=True)]
        ).encode()
    sent = {}
    if hub.order.composite:
        sent = {e.position: e.cursor for e in hub.window.after(ZERO)}
    out = []
    for conn in hub.connections:
        reg = conn.registration
        behind = tail.unread
        if conn.coalesced is not None:
            behind += len(conn.coalesced)
        elif not conn.live:
            behind += sum(1 for e in hub.window.after(conn.position) if conn.wants(e))
        last = conn.last_sent
        for kind in reg.kinds:
            out.append(
                {
                    "instance": reg.instance,
                    "service": reg.service,
                    "changeKind": kind.to_wire(),
                    "connectedSince": time.strftime(
                        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(conn.connected_at)
                    ),
                    "remote": conn.remote,
                    "lastCursorSent": _cursor_sent(hub, last, sent),
                    "itemsBehindHead": behind,
                    "headCursor": head,
                    "publisher": publisher_id,
                }
            )
    return out


def _cursor_sent(hub: Hub, last: StreamId | None, sent: dict[StreamId, str | None]) -> str | None:
    """The cursor of the entry at window position `last` (None: not known any more)."""
    if last is None:
        return None
    if hub.order.composite:
        return sent.get(last)
    return Position.single(hub.epoch, last).encode()


__all__ = ["coalescing", "registrations"]
