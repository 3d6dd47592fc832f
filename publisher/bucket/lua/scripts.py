"""The Lua scripts of the bucket, read from the `.lua` files beside this module.

Each script is `lib.lua` (the functions every script shares: id order, partitions, the head, the
creation of the bucket) followed by its own file. The files are package data, found with
`importlib.resources`, so they are loaded the same from a checkout, an editable install or a
wheel. Only the bucket package runs them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files


@dataclass(frozen=True, slots=True)
class Script:
    """A script's text and the SHA-1 that EVALSHA names it by."""

    name: str
    text: str
    sha: str


def load(name: str) -> Script:
    """The script `<name>.lua`, preceded by `lib.lua`."""
    package = files(__package__)
    text = package.joinpath("lib.lua").read_text() + package.joinpath(f"{name}.lua").read_text()
    return Script(name, text, hashlib.sha1(text.encode()).hexdigest())


COMMIT = load("commit")
"""Store states and append change items atomically, once per idempotency key."""
ENSURE = load("ensure")
"""Create the bucket (epoch, partition count) or check its partition count."""
TRIM = load("trim")
"""Trim the log by age and count; forget idempotency keys older than the age."""
RETENTION = load("retention")
"""Epoch, trimmed horizon, head and oldest entry, in one call."""
PAGE = load("page")
"""A page of stored states (whole index or a watch's pieces) with the head: one snapshot."""

TAIL = load("tail")
"""The tail's read: entries after a position with the epoch, head, horizon and a witness."""
RENEW_EPOCH = load("renew_epoch")
"""Start a new epoch if it is still the caller's (a rollback was seen)."""
SAVE_CURSORS = load("save_cursors")
"""Store a feed consumer's cursor set: bounded in number, expiring."""
DURABLE = load("durable")
"""Every operation on one durable consumer (create, info, redeliver, dispatch, settle, delete)."""

__all__ = ["COMMIT", "DURABLE", "ENSURE", "PAGE", "RENEW_EPOCH", "RETENTION", "SAVE_CURSORS",
           "TAIL", "TRIM", "Script", "load"]
