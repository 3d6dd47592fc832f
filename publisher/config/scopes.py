"""Scopes: what an identity may do on a publisher. Pure code.

    listen:<resource>   register a websocket listener for that resource (`listen:*`: any)
    read:<resource>     its bootstrap route and objects (`read:*`: any)
    events              the pull routes (/changefeeds/events, /changefeeds/rpc, the feed)
    feed:<consumer>     store and resume the feed cursors of that consumer (`feed:*`: any)
    durable:<consumer>  create, read, fetch from, settle and delete that durable consumer
                        (`durable:*`: any)
    stats               /changefeeds/stats with every registration and address (else counts),
                        and /changefeeds/trace/<cursor> (publisher.web.trace_route)
    publish             any HTTP route that writes
    admin               everything above, and any route not named here

docs/security.md describes them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from changefeed import configjs as cj
from changefeed.errors import ConfigError

WILDCARD = "*"
SIMPLE = frozenset({"events", "stats", "publish", "admin"})
SCOPED = ("listen", "read", "feed", "durable")
DURABLE_PREFIX = "durable:"
"""How `parse_scopes`' `consumers` names a durable consumer, beside the feed consumers."""
ADMIN = "admin"
EVERYTHING = frozenset({ADMIN})
"""The scopes of the anonymous identity of a publisher without authentication."""


def allows(scopes: Collection[str], needed: str) -> bool:
    """True when `scopes` grant `needed` (`admin` grants all; `kind:*` every `kind:<name>`)."""
    if ADMIN in scopes or needed in scopes:
        return True
    kind, _, name = needed.partition(":")
    return bool(name) and f"{kind}:{WILDCARD}" in scopes


def may_listen(scopes: Collection[str]) -> bool:
    """True when `scopes` grant listening for at least one resource."""
    return ADMIN in scopes or any(scope.startswith("listen:") for scope in scopes)


def refused_resources(scopes: Collection[str], resources: Iterable[str]) -> list[str]:
    """The resources of a registration that `scopes` do not grant `listen:` for."""
    return [r for r in resources if not allows(scopes, f"listen:{r}")]


def parse_scopes(
    key: str, value: Any, resources: Collection[str], consumers: Collection[str]
) -> frozenset[str]:
    """A non-empty list of scopes naming configured resources and consumers (or `*`).

    `consumers` holds the feed consumers' names and, prefixed with `durable:`, the durable
    consumers' names."""
    expected = (
        "a non-empty list of scopes: listen:<resource>, read:<resource>, events, "
        "feed:<consumer>, durable:<consumer>, stats, publish, admin (<resource>, <consumer> "
        "may be '*')"
    )
    durables = {c.removeprefix(DURABLE_PREFIX) for c in consumers if c.startswith(DURABLE_PREFIX)}
    feeds = {c for c in consumers if not c.startswith(DURABLE_PREFIX)}
    if not isinstance(value, list) or not value or not all(isinstance(s, str) for s in value):
        raise ConfigError(key, value, expected)
    for i, scope in enumerate(value):
        where = f"{key}[{i}]"
        if scope in SIMPLE:
            continue
        kind, colon, name = scope.partition(":")
        if kind not in SCOPED or not colon or not (name == WILDCARD or cj.NAME.match(name)):
            raise ConfigError(where, scope, expected)
        known = {"feed": feeds, "durable": durables}.get(kind, resources)
        if name != WILDCARD and name not in known:
            what = {"feed": "feed.consumers", "durable": "durable.consumers"}.get(kind, "resources")
            listed = ", ".join(sorted(known)) or "none"
            raise ConfigError(where, scope, f"a name of {what} ({listed}) or '*'")
    if len(set(value)) != len(value):
        raise ConfigError(key, value, "scopes without duplicates")
    return frozenset(value)


__all__ = ["ADMIN", "DURABLE_PREFIX", "EVERYTHING", "allows", "may_listen", "parse_scopes",
           "refused_resources"]
