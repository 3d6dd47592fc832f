"""The per-connection delivery decision: what the fan-out does with a new entry for one
connection it matches. Pure: the facts in, a `Verdict` out; the fan-out (publisher.delivery.fanout)
carries it out, for one entry or a batch, and a catch-up asks `room` before each write.

| the connection                              | verdict  | the fan-out                          |
| ------------------------------------------- | -------- | ------------------------------------ |
| not live, in a coalesced catch-up           | `FOLD`   | folds the entry into its set         |
| not live, catching up from the window       | `PASS`   | nothing: it reads the entry there    |
| live, closing (it or its transport)         | `SKIP`   | nothing                              |
| live, more than `send_buffer` bytes queued  | `BEHIND` | it falls behind and catches up       |
| live, a server-sent events stream           | `CHUNK`  | writes the entry's SSE chunk         |
| live, a websocket                           | `FRAME`  | writes the entry's websocket frame   |

`queued` is what its transport holds, plus, in a batch, the frames of the batch queued for it.
"""

from __future__ import annotations

import enum

from publisher.delivery.subscribers import Subscriber


class Verdict(enum.Enum):
    FOLD = "fold"
    PASS = "pass"
    SKIP = "skip"
    BEHIND = "behind"
    CHUNK = "chunk"
    FRAME = "frame"


FOLD, PASS, SKIP, BEHIND, CHUNK, FRAME = Verdict
SENT = frozenset({CHUNK, FRAME})
"""The verdicts that write the entry."""


def decide(conn: Subscriber, closing: bool, queued: int, send_buffer: int) -> Verdict:
    """What the fan-out does with a new entry for `conn`, whose transport is `closing` and
    holds `queued` bytes (see the module's table)."""
    if not conn.live:
        return FOLD if conn.coalesced is not None and not conn.closing else PASS
    return room(conn, closing, queued, send_buffer)


def room(conn: Subscriber, closing: bool, queued: int, send_buffer: int) -> Verdict:
    """Whether `conn` can be written an item now, live or catching up: `SKIP` (closing),
    `BEHIND` (past `send_buffer`: wait for it to drain, or fall behind), else what to write."""
    if closing or conn.closing:
        return SKIP
    if queued > send_buffer:
        return BEHIND
    return CHUNK if conn.sse else FRAME


__all__ = ["BEHIND", "CHUNK", "FOLD", "FRAME", "PASS", "SENT", "SKIP", "Verdict", "decide", "room"]
