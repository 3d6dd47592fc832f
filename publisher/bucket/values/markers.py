"""The keyset marker of bootstrap pages (`?marker=`): an opaque, URL-safe form of the last id."""

from __future__ import annotations

import base64
import binascii

from publisher.bucket.values.changes import MAX_ID_BYTES


def encode_marker(last_id: str) -> str:
    """The opaque keyset marker of the page after `last_id`."""
    return base64.urlsafe_b64encode(last_id.encode()).decode().rstrip("=")


def decode_marker(marker: str) -> str:
    """The id a marker stands for; ValueError when it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(marker + "=" * (-len(marker) % 4))
        text = raw.decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("not a marker issued by this route") from None
    if not text or len(raw) > MAX_ID_BYTES or encode_marker(text) != marker:
        raise ValueError("not a marker issued by this route")
    return text


__all__ = ["decode_marker", "encode_marker"]
