"""The per-connection delivery decision: what the fan-out does with a new entry for one
connection it matches. Pure: the facts in, a `Verdict` out; the fan-out (publisher.delivery.fanout)
carries it out, for one entry or a batch, and a catch-up asks it before each write.

It is taken in two halves, both here. A connection's own state (live or catching up, coalescing,
closing, SSE or websocket) changes rarely: `mode_of` turns it into its *mode*, its verdicts by
its transport's facts, which the connection keeps (`Subscriber.mode`, set by
its own methods when that state changes). Its transport changes with every write: `decide` takes
the mode and the transport's facts. So the fan-out's common case is the mode plus one comparison.

| the connection                            | its mode    | verdict  | the fan-out                 |
| ----------------------------------------- | ----------- | -------- | --------------------------- |
| not live, in a coalesced catch-up         | `FOLDING`   | `FOLD`   | folds the entry into its set|
| not live, catching up from the window     | `PASSING`   | `PASS`   | nothing: it reads the window|
| live, closing                             | `CLOSING`   | `SKIP`   | nothing                     |
| live, its transport closing               | a live one  | `SKIP`   | nothing                     |
| live, over `send_buffer` bytes queued     | a live one  | `BEHIND` | falls it behind: catch-up   |
| live, a server-sent events stream         | `STREAM`    | `CHUNK`  | writes the entry's SSE chunk|
| live, a websocket                         | `WEBSOCKET` | `FRAME`  | writes the entry's frame    |

A mode is a table itself, `mode[closing][queued > send_buffer]`: `decide` is that lookup.
`queued` is what its transport holds, plus, in a batch, the frames of the batch queued for it.
"""

from __future__ import annotations

import enum


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


Mode = tuple[tuple[Verdict, Verdict], tuple[Verdict, Verdict]]
"""A connection's verdicts by its transport's facts: `mode[closing][queued > send_buffer]`."""


def _live(written: Verdict) -> Mode:
    return (written, BEHIND), (SKIP, SKIP)


def _whatever(verdict: Verdict) -> Mode:
    return (verdict, verdict), (verdict, verdict)


WEBSOCKET, STREAM = _live(FRAME), _live(CHUNK)
FOLDING, PASSING, CLOSING = _whatever(FOLD), _whatever(PASS), _whatever(SKIP)


def mode_of(live: bool, sse: bool, coalescing: bool, closing: bool) -> Mode:
    """The mode of a connection that is `live` (else catching up), an `sse` stream (else a
    websocket), `coalescing` its catch-up and `closing` (see the module's table). A catch-up
    asks as if its connection were live."""
    if not live:
        return FOLDING if coalescing and not closing else PASSING
    if closing:
        return CLOSING
    return STREAM if sse else WEBSOCKET


def decide(mode: Mode, closing: bool, queued: int, send_buffer: int) -> Verdict:
    """What the fan-out does with a new entry for a connection of `mode` whose transport is
    `closing` and holds `queued` bytes: the mode's verdict for those facts. The fan-out's loop
    indexes the mode so itself (`mode[closing][queued > send_buffer]`), which saves a call per
    delivery; this is the same lookup."""
    return mode[closing][queued > send_buffer]


__all__ = [
    "BEHIND", "CHUNK", "CLOSING", "FOLD", "FOLDING", "FRAME", "PASS", "PASSING", "SENT", "SKIP",
    "STREAM", "WEBSOCKET", "Mode", "Verdict", "decide", "mode_of",
]
