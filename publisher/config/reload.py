"""What a new config.js may change in a running publisher (SIGHUP), and what it may not. Pure.

The listening address and its connection timeouts, the Redis and the bucket, the resources, the
state directory, the window's size and the feed's consumers are fixed when the publisher starts:
`fixed_changes` names those a new config changes, and `keep_fixed` keeps their old values, so the
publisher runs on with everything else of the new config.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from publisher.config.settings import Config

FIXED_SERVER = ("host", "port", "idle_timeout", "body_timeout", "max_body_bytes")
FIXED_LIMITS = ("window",)


def _camel(name: str) -> str:
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)


def _fields(
    section: str, before: Any, after: Any, only: tuple[str, ...] | None = None
) -> list[str]:
    names = only or tuple(f.name for f in dataclasses.fields(before))
    return [f"{section}.{_camel(n)}" for n in names if getattr(before, n) != getattr(after, n)]


def fixed_changes(old: Config, new: Config) -> list[str]:
    """The config keys `new` changes that cannot change while the publisher runs."""
    changed = []
    if old.resources != new.resources:
        changed.append("resources")
    if old.state_dir != new.state_dir:
        changed.append("stateDir")
    changed += _fields("bucket", old.bucket, new.bucket)
    changed += _fields("server", old.server, new.server, FIXED_SERVER)
    changed += _fields("limits", old.limits, new.limits, FIXED_LIMITS)
    changed += _fields("feed", old.feed, new.feed)
    if old.outbox != new.outbox:
        changed.append("outbox")
    if old.capture != new.capture:
        changed.append("capture")
    return changed


def keep_fixed(old: Config, new: Config) -> Config:
    """`new`, with the parts that cannot change live as they are in `old`."""
    server = dataclasses.replace(
        new.server, **{name: getattr(old.server, name) for name in FIXED_SERVER}
    )
    limits = dataclasses.replace(
        new.limits, **{name: getattr(old.limits, name) for name in FIXED_LIMITS}
    )
    return dataclasses.replace(
        new,
        resources=old.resources,
        state_dir=old.state_dir,
        bucket=old.bucket,
        feed=old.feed,
        outbox=old.outbox,
        capture=old.capture,
        server=server,
        limits=limits,
    )


__all__ = ["fixed_changes", "keep_fixed"]
