"""The change items the benchmarks send: 150 bytes of JSON, shaped as the publisher's.

Latency runs carry the send time in the item itself: `changedResourceId` is the time of the
commit (or publish), in microseconds since an origin shared by every process of the run, as 7
base-36 digits. CLOCK_MONOTONIC is system-wide on Linux, so a client process computes an item's
age from its own clock. Pure code.
"""

from __future__ import annotations

import orjson

ID_LENGTH = 7
"""Characters of a changedResourceId: with the rest of an item, 150 bytes of JSON."""
ID_MARK = b'"changedResourceId":"'
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


def stamp_in(payload: bytes | memoryview, start: int, end: int) -> bytes | None:
    """The id of the item at payload[start:end], or None if it has none."""
    data = bytes(payload) if isinstance(payload, memoryview) else payload
    at = data.find(ID_MARK, start, end)
    if at < 0:
        return None
    at += len(ID_MARK)
    return data[at : at + ID_LENGTH]


def item_json(
    resource: str, sub_resources: list[str], changed_id: str, ms: int, cursor: str
) -> bytes:
    """An item in the publisher's wire format (docs/protocol.md), for the baseline servers."""
    return orjson.dumps(
        {
            "changeKind": {"resource": resource, "subResources": sub_resources},
            "changedResourceId": changed_id,
            "published": str(ms),
            "cursor": cursor,
        }
    )


def fake_cursor(ms: int, seq: int) -> str:
    """A string as long as the publisher's cursor for stream id ms-seq (not a valid cursor)."""
    hexseq = f"{seq:x}"
    return f"benchbench.{ms:012x}{chr(ord('a') + len(hexseq) - 1)}{hexseq}"
