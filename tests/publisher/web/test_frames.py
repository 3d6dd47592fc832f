"""ClientFrames follows frames by their headers, however the bytes are cut (pure, no sockets)."""

from __future__ import annotations

import struct
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from publisher.web.frames import ClientFrames


def frame(payload: bytes, masked: bool = True, opcode: int = 0x81) -> bytes:
    n = len(payload)
    bit = 0x80 if masked else 0
    if n < 126:
        head = struct.pack("!BB", opcode, bit | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", opcode, bit | 126, n)
    else:
        head = struct.pack("!BBQ", opcode, bit | 127, n)
    return head + (b"mask" if masked else b"") + payload


def feed(stream: bytes, cuts: list[int]) -> bool:
    frames = ClientFrames()
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    return all(frames.feed(stream[a:b]) for a, b in pairwise(points))


SIZES = st.sampled_from([0, 1, 125, 126, 127, 65535, 65536, 70000])


@settings(max_examples=60, deadline=None)
@given(st.lists(SIZES, min_size=1, max_size=4), st.lists(st.integers(0, 10**6), max_size=12))
def test_masked_frames_pass_however_cut(sizes: list[int], cuts: list[int]) -> None:
    stream = b"".join(frame(b"x" * size) for size in sizes)
    assert feed(stream, cuts)


@settings(max_examples=60, deadline=None)
@given(st.lists(SIZES, max_size=3), st.lists(st.integers(0, 10**6), max_size=12))
def test_an_unmasked_frame_is_found_however_cut(sizes: list[int], cuts: list[int]) -> None:
    stream = b"".join(frame(b"x" * size) for size in sizes) + frame(b"ping", masked=False)
    assert not feed(stream, cuts)
