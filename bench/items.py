"""The change items the benchmarks send: 150 bytes of JSON, shaped as the publisher's.

Latency runs carry the send time in the item itself: `changedResourceId` is the time the commit
(or publish) was due (`due_times`), in microseconds since an origin shared by every process of the
run, as 7 base-36 digits. CLOCK_MONOTONIC is system-wide on Linux, so a client process computes
an item's age from its own clock. Pure code.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from changefeed.cursor import Position, StreamId
from changefeed.protocol import ChangeItem

ID_LENGTH = 7
"""Characters of a changedResourceId: with the rest of an item, 150 bytes of JSON."""
ID_MARK = b'"changedResourceId":"'
EPOCH = "benchbench"
"""The epoch of the baselines' cursors: as long as the publisher's."""
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
_SPAN = 36**ID_LENGTH


def stamp(now_ns: int, origin_ns: int) -> str:
    """The id carrying `now_ns`: microseconds since `origin_ns`, 7 base-36 digits (21 hours)."""
    value = ((now_ns - origin_ns) // 1000) % _SPAN
    digits = []
    for _ in range(ID_LENGTH):
        value, rest = divmod(value, 36)
        digits.append(_DIGITS[rest])
    return "".join(reversed(digits))


def age_us(stamp_text: bytes, now_ns: int, origin_ns: int) -> int:
    """Microseconds between the stamp and `now_ns`."""
    return (now_ns - origin_ns) // 1000 - int(stamp_text, 36)


def counter_id(number: int) -> str:
    """A plain id of the same length, for runs that only count."""
    return f"{number % 10**ID_LENGTH:0{ID_LENGTH}d}"


def stamp_in(payload: bytes, start: int, end: int) -> bytes | None:
    """The id of the item at payload[start:end], or None if it has none."""
    at = payload.find(ID_MARK, start, end)
    if at < 0:
        return None
    at += len(ID_MARK)
    return payload[at : at + ID_LENGTH]


def item(changed_id: str, ms: int) -> bytes:
    """A `vm`/`nic` item encoded as the publisher encodes it (docs/protocol.md), published at
    `ms` (a real time: as many digits as the publisher's) with the cursor of stream id ms-0:
    what the baseline servers and the NATS and pub/sub publishers send."""
    cursor = Position.single(EPOCH, StreamId(ms, 0)).encode()
    return ChangeItem("vm", ("nic",), changed_id, ms, cursor).encode()


def due_times(start_ns: int, rate: float) -> Iterator[int]:
    """The time each send is due at `rate` a second from `start_ns`: start, start + 1/rate...

    Every paced side stamps an item with its due time, not the time it got round to sending
    it, so a side that falls behind its schedule shows it as latency."""
    for number in itertools.count():
        yield start_ns + int(number * 1e9 / rate)
