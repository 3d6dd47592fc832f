"""The checks of the publisher's own config.js keys (the shared ones are in
`changefeed.configjs`): a validator per kind of value, the key table of each section
(config.js key -> dataclass field, validator), `section_of` that builds a section's dataclass
from its table, and `resources_of` for the `resources` list. Pure code; `settings.py` puts them
together.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any, TypeVar

from changefeed import configjs as cj
from changefeed import feed
from changefeed.errors import ConfigError
from changefeed.protocol import CHANGEFEEDS, WILDCARD, Resource

T = TypeVar("T")

_ROUTE = re.compile(r"^/[A-Za-z0-9_.~/-]*$")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def log_level(key: str, value: Any) -> str:
    if not isinstance(value, str) or value.lower() not in LOG_LEVELS:
        raise ConfigError(key, value, f"one of {', '.join(LOG_LEVELS)}")
    return value.lower()


def _non_negative(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(key, value, "a number of seconds, 0 or more")
    return float(value)


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _networks(key: str, value: Any) -> tuple[IPNetwork, ...]:
    expected = "a list of IP addresses or networks, e.g. [\"127.0.0.1\", \"10.0.0.0/8\"]"
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(key, value, expected)
    try:
        return tuple(ipaddress.ip_network(v, strict=False) for v in value)
    except ValueError:
        raise ConfigError(key, value, expected) from None


HEALTH_KEYS: Checks = {
    "maxLagItems": ("max_lag_items", cj.positive_int),
    "maxLagSeconds": ("max_lag_seconds", cj.positive),
    "drainDelay": ("drain_delay", _non_negative),
}

FLEET_KEYS: Checks = {
    "interval": ("interval", cj.positive),
    "ttl": ("ttl", cj.positive),
}

MAX_TRACE_ITEMS = 100_000


def _trace_items(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TRACE_ITEMS:
        raise ConfigError(key, value, f"an integer from 0 (no trace) to {MAX_TRACE_ITEMS}")
    return value


def _trace_age(key: str, value: Any) -> float | None:
    if value is None or value == 0:
        return None
    return cj.positive(key, value)


TRACE_KEYS: Checks = {
    "items": ("items", _trace_items),
    "maxAge": ("max_age", _trace_age),
}

_JOYENT_VERSION = re.compile(r"^1\.(?P<minor>[0-5])(?:\.\d{1,4})?$")


def _joyent_version(key: str, value: Any) -> str | None:
    """A node-sdc-changefeed version 1.0 to 1.5 (publisher.web.discovery.OLD_SHAPES has a shape
    for each), as `1.<minor>`; None: RFD 5's shape."""
    if value is None:
        return None
    match = _JOYENT_VERSION.match(value) if isinstance(value, str) else None
    if match is None:
        raise ConfigError(
            key, value, 'a node-sdc-changefeed version from "1.0" to "1.5" (e.g. "1.4": a bare '
            'array, "1.5": an object keyed by resource), or null for RFD 5\'s shape')
    return f"1.{match['minor']}"


DISCOVERY_KEYS: Checks = {
    "defaultVersion": ("default_version", _joyent_version),
}


# --- validators of the publisher's own keys (the shared ones are in changefeed.configjs) ---


MAX_PARTITIONS = 1024


def _partitions(key: str, value: Any) -> int:
    expected = f"a power of two from 1 to {MAX_PARTITIONS}"
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARTITIONS:
        raise ConfigError(key, value, expected)
    if value & (value - 1):
        raise ConfigError(key, value, expected)
    return value


def max_items(key: str, value: Any) -> int | None:
    if value is None or value == 0:
        return None
    return cj.positive_int(key, value)


Checks = dict[str, tuple[str, Callable[[str, Any], Any]]]
"""config.js key -> (dataclass field, validator) of one section."""


def section_of(
    obj: dict[str, Any],
    name: str,
    make: Callable[..., T],
    checks: Checks,
    others: frozenset[str] | set[str] = frozenset(),
) -> T:
    """The dataclass of section `name` of `obj`: its defaults, overridden by the keys of
    `checks`, validated (`others` are allowed keys the caller reads itself)."""
    section = cj.section(obj.get(name, {}), name)
    cj.only(section, name + ".", {*checks, *others})
    return make(
        **{attr: check(f"{name}.{key}", section[key])
           for key, (attr, check) in checks.items() if key in section}
    )


def _consumers(key: str, value: Any) -> frozenset[str]:
    expected = "a list of consumer names (1 to 50 letters, digits, '_', '.' or '-'), no duplicates"
    if not isinstance(value, list) or not all(
        isinstance(v, str) and feed.NAME.match(v) for v in value
    ):
        raise ConfigError(key, value, expected)
    if len(set(value)) != len(value):
        raise ConfigError(key, value, expected)
    return frozenset(value)


BUCKET_KEYS: Checks = {
    "name": ("name", cj.name),
    "partitions": ("partitions", _partitions),
    "poolSize": ("pool_size", cj.positive_int),
    "poolTimeout": ("pool_timeout", cj.positive),
}

SERVER_KEYS: Checks = {
    "host": ("host", cj.host),
    "port": ("port", cj.port),
    "maxConnections": ("max_connections", cj.positive_int),
    "maxConnectionsPerClient": ("max_connections_per_client", cj.positive_int),
    "idleTimeout": ("idle_timeout", cj.positive),
    "bodyTimeout": ("body_timeout", cj.positive),
    "maxBodyBytes": ("max_body_bytes", cj.positive_int),
    "trustedProxies": ("trusted_proxies", _networks),
}

FEED_KEYS: Checks = {
    "consumers": ("consumers", _consumers),
    "cursorSetMaxAge": ("cursor_set_max_age", cj.positive),
    "maxCursorSets": ("max_cursor_sets", cj.positive_int),
}

DURABLE_KEYS: Checks = {
    "consumers": ("consumers", _consumers),
    "maxAckPending": ("max_ack_pending", cj.positive_int),
    "maxAckWait": ("max_ack_wait", cj.positive),
    "maxDeadLetters": ("max_dead_letters", cj.positive_int),
}

LIMIT_KEYS: Checks = {
    "registrationBytes": ("registration_bytes", cj.positive_int),
    "registrationTimeout": ("registration_timeout", cj.positive),
    "pageSize": ("page_size", cj.positive_int),
    "maxPageSize": ("max_page_size", cj.positive_int),
    "window": ("window", cj.positive_int),
    "sendBuffer": ("send_buffer", cj.positive_int),
    "coalesceIds": ("coalesce_ids", cj.positive_int),
    "pingInterval": ("ping_interval", cj.positive),
    "results": ("results", cj.positive_int),
    "maxResults": ("max_results", cj.positive_int),
    "wait": ("wait", cj.positive),
    "maxWait": ("max_wait", cj.positive),
}


def resources_of(value: Any) -> tuple[Resource, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(
            "resources", value, "a non-empty list of {resource, subResources, bootstrapRoute}"
        )
    seen: dict[str, str] = {}
    routes: dict[str, str] = {}
    out = []
    for i, entry in enumerate(value):
        where = f"resources[{i}]"
        entry = cj.section(entry, where)
        cj.only(entry, where + ".", {"resource", "subResources", "bootstrapRoute"})
        for key in ("resource", "subResources", "bootstrapRoute"):
            if key not in entry:
                raise ConfigError(f"{where}.{key}", None, "present")
        name = cj.name(f"{where}.resource", entry["resource"])
        if name in seen:
            raise ConfigError(
                f"{where}.resource", name, f"a resource not already listed at {seen[name]}"
            )
        seen[name] = where
        subs = entry["subResources"]
        if (
            not isinstance(subs, list)
            or not subs
            or not all(isinstance(s, str) and cj.NAME.match(s) for s in subs)
        ):
            raise ConfigError(f"{where}.subResources", subs, "a non-empty list of names")
        if len(set(subs)) != len(subs) or WILDCARD in subs:
            raise ConfigError(f"{where}.subResources", subs, "names without duplicates or '*'")
        route = entry["bootstrapRoute"]
        if not isinstance(route, str) or not _ROUTE.match(route) or route.rstrip("/") == "":
            raise ConfigError(f"{where}.bootstrapRoute", route, "an absolute path such as '/vms'")
        route = route.rstrip("/")
        if route == CHANGEFEEDS or route.startswith(CHANGEFEEDS + "/"):
            raise ConfigError(f"{where}.bootstrapRoute", route, "a path outside /changefeeds")
        if route in routes:
            raise ConfigError(
                f"{where}.bootstrapRoute", route, f"a route not already used by {routes[route]}"
            )
        routes[route] = where
        out.append(Resource(name, tuple(subs), route))
    return tuple(out)


__all__ = [
    "BUCKET_KEYS",
    "DURABLE_KEYS",
    "FEED_KEYS",
    "FLEET_KEYS",
    "HEALTH_KEYS",
    "LIMIT_KEYS",
    "LOG_LEVELS",
    "MAX_PARTITIONS",
    "MAX_TRACE_ITEMS",
    "SERVER_KEYS",
    "TRACE_KEYS",
    "Checks",
    "IPNetwork",
    "log_level",
    "max_items",
    "resources_of",
    "section_of",
]
