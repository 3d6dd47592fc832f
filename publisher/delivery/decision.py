"""The per-connection delivery decision: what the fan-out does with a new entry for one
connection it matches. Pure: the facts in, a `Verdict` out; the fan-out (publisher.delivery.fanout)
carries it out, for one entry or a batch, and a catch-up asks it before each write.

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


def decide(
    conn: Subscriber, closing: bool, queued: int, send_buffer: int, catching_up: bool = False
) -> Verdict:
    """What the fan-out does with a new entry for `conn`, whose transport is `closing` and
    holds `queued` bytes (see the module's table). `catching_up`: asked by `conn`'s own
    catch-up before it writes, as if `conn` were live (`SKIP`, `BEHIND`: wait for it to drain,
    else what to write)."""
    if conn.live or catching_up:
        if closing or conn.closing:
            return SKIP
        if queued > send_buffer:
            return BEHIND
        return CHUNK if conn.sse else FRAME
    return FOLD if conn.coalesced is not None and not conn.closing else PASS


__all__ = ["BEHIND", "CHUNK", "FOLD", "FRAME", "PASS", "SENT", "SKIP", "Verdict", "decide"]
