"""`GET /changefeeds` without an upgrade: the resources, in the shape the client's
`Accept-Version` asks for (docs/http.md#get-changefeeds).

Joyent's node-sdc-changefeed publisher answered this route with a bare array of resources up to
its 1.4 releases, and with an object keyed by resource name in 1.5 (`res.send(this.resources)`).
Its restify route carried the API versions 1.0.0 and 2.0.0 (the registration formats) with one
handler, so there the header never chose the shape: the package version did. Here an older shape
is asked for by the package version that served it, matched as restify matched ranges (the
newest satisfying version wins); the ranges listeners send (`~1`, `~2`: a major version only)
and no header get ours, RFD 5's `{"resources": [...]}`, unless config.js's
`discovery.defaultVersion` names the package version whose shape a request without the header
gets (clients of a Joyent 1.x publisher read its shape without asking for it).

| version | shape |
| --- | --- |
| 1.0.0 to 1.4.0 | `[resource, ...]` |
| 1.5.0 | `{"vm": resource, ...}` |
| none, or a major version only | `{"resources": [...], "partitions": n}` |
"""

from __future__ import annotations

import re
from typing import Any, Literal

from publisher.config.settings import Config

Shape = Literal["resources", "array", "keyed"]
_RANGE = re.compile(
    r"^(?P<op>~|\^|=|v|<=|<)?\s*(?P<major>\d+)"
    r"(?:\.(?P<minor>\d+|x|\*)(?:\.(?P<patch>\d+|x|\*))?)?$"
)
OLD_SHAPES: tuple[tuple[int, Shape], ...] = (
    (0, "array"), (1, "array"), (2, "array"), (3, "array"), (4, "array"), (5, "keyed"),
)
"""node-sdc-changefeed 1.<minor>: the shape its publisher served."""


class VersionRefused(ValueError):
    """An `Accept-Version` no shape satisfies (HTTP 400 BadAcceptVersion)."""


def shape_for(header: str | None, default_version: str | None = None) -> Shape:
    """The shape `Accept-Version: header` asks for; VersionRefused when none satisfies it.
    `default_version` (`discovery.defaultVersion`, a node-sdc-changefeed version `1.<minor>`):
    the version whose shape a request without the header gets; None: ours."""
    text = (header or "").strip()
    if not text and default_version is not None:
        text = "~" + default_version
    if text in ("", "*"):
        return "resources"
    match = _RANGE.match(text)
    if match is None:
        raise VersionRefused(_refusal(text))
    op, major, minor = match["op"] or "", int(match["major"]), match["minor"]
    if minor in (None, "x", "*") and op not in ("<", "<="):
        if major in (1, 2):
            return "resources"
        raise VersionRefused(_refusal(text))
    if major == 2 and op not in ("<", "<="):
        return "resources"
    if major != 1 or minor in (None, "x", "*"):
        raise VersionRefused(_refusal(text))
    wanted = int(minor)
    satisfying = [
        (old, shape) for old, shape in OLD_SHAPES
        if (op in ("", "=", "v", "~") and old == wanted)
        or (op == "^" and old >= wanted)
        or (op == "<" and old < wanted)
        or (op == "<=" and old <= wanted)
    ]
    if not satisfying:
        raise VersionRefused(_refusal(text))
    return max(satisfying)[1]


def _refusal(text: str) -> str:
    return (f"unsupported Accept-Version {text[:50]!r} for GET /changefeeds: ~1 or ~2 (or none) "
            "for this publisher's shape, ~1.4 for node-sdc-changefeed 1.4's array, ~1.5 for "
            "1.5's object keyed by resource")


def resources_body(config: Config, shape: Shape) -> Any:
    """The body of GET /changefeeds in `shape`."""
    entries = [resource.to_wire() for resource in config.resources]
    if shape == "array":
        return entries
    if shape == "keyed":
        return {entry["resource"]: entry for entry in entries}
    return {"resources": entries, "partitions": config.bucket.partitions}


__all__ = ["OLD_SHAPES", "Shape", "VersionRefused", "resources_body", "shape_for"]
