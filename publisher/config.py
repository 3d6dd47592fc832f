"""config.js: parsed by one pure function into frozen dataclasses.

The file is a JavaScript object literal (comments, unquoted keys, trailing commas), optionally
written as ``module.exports = { ... };``. Unknown keys are errors; every error names the key, the
value and what was expected. docs/config.md describes every key.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import json5

from publisher.errors import ConfigError
from publisher.protocol import WILDCARD, Resource

T = TypeVar("T")

_MODULE_EXPORTS = re.compile(r"^((?:\s+|//[^\n]*(?:\n|$)|/\*.*?\*/)*)module\.exports\s*=\s*", re.S)
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_ROUTE = re.compile(r"^/[A-Za-z0-9_.~/-]*$")


@dataclass(frozen=True, slots=True)
class Server:
    host: str = "127.0.0.1"
    port: int = 8080


@dataclass(frozen=True, slots=True)
class Bucket:
    """Where the change bucket and the store live."""

    redis_url: str | None = None
    """None: start an embedded redis-server under the state directory."""
    name: str = "changefeed"
    """Key prefix of every Redis key of this bucket."""
    partitions: int = 1
    """Streams the log is split into (a power of two), fixed when the bucket is created."""

    @property
    def display_url(self) -> str | None:
        """The Redis URL with any password masked, for logs."""
        if self.redis_url is None:
            return None
        parts = urlsplit(self.redis_url)
        if parts.password is None:
            return self.redis_url
        netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
        return parts._replace(netloc=netloc).geturl()


@dataclass(frozen=True, slots=True)
class Limits:
    registration_bytes: int = 65536
    registration_timeout: float = 10.0
    page_size: int = 100
    max_page_size: int = 1000
    window: int = 10000
    send_buffer: int = 1 << 20
    ping_interval: float = 20.0
    results: int = 100
    """Items in an `events` reply or a feed response when the client names no number."""
    max_results: int = 1000
    wait: float = 10.0
    """Seconds a long poll waits when the client names no wait time."""
    max_wait: float = 60.0


@dataclass(frozen=True, slots=True)
class Config:
    resources: tuple[Resource, ...]
    max_age: float = 3600.0
    max_items: int | None = None
    """Most items the log retains (the oldest beyond it are trimmed); None: no limit."""
    bucket: Bucket = field(default_factory=Bucket)
    server: Server = field(default_factory=Server)
    limits: Limits = field(default_factory=Limits)
    state_dir: Path = Path(".changefeed")
    gc_interval: float | None = None
    """Seconds between trims; None derives it from maxAge (a tenth, between 1 s and 60 s)."""

    @property
    def resource_map(self) -> dict[str, Resource]:
        return {r.resource: r for r in self.resources}

    @property
    def trim_every(self) -> float:
        if self.gc_interval is not None:
            return self.gc_interval
        return min(60.0, max(1.0, self.max_age / 10))

    def with_overrides(
        self, host: str | None = None, port: int | None = None, redis_url: str | None = None
    ) -> Config:
        """The command line's --host, --port and --redis-url, validated like the file's."""
        server = self.server
        if host is not None:
            server = dataclasses.replace(server, host=_host("--host", host))
        if port is not None:
            server = dataclasses.replace(server, port=_port("--port", port))
        bucket = self.bucket
        if redis_url is not None:
            bucket = dataclasses.replace(bucket, redis_url=_redis_url("--redis-url", redis_url))
        return dataclasses.replace(self, server=server, bucket=bucket)


def load_config(path: str | Path) -> Config:
    """Read and validate a config.js file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError("<file>", str(path), f"a readable config.js ({exc.strerror})") from None
    return parse_config(text, base=path.resolve().parent)


def parse_config(text: str, base: Path | None = None) -> Config:
    """Build a Config from the text of a config.js; relative paths resolve against `base`."""
    body = _MODULE_EXPORTS.sub(r"\1", text, count=1).rstrip().rstrip(";")
    try:
        raw = json5.loads(body, allow_duplicate_keys=False)
    except ValueError as exc:
        raise ConfigError(
            "<file>", text[:40] + "...", f"a JavaScript object literal ({exc})"
        ) from None
    obj = _section(raw, "<top level>")
    _only(
        obj,
        "",
        {"resources", "maxAge", "maxItems", "bucket", "server", "limits", "stateDir", "gcInterval"},
    )

    if "resources" not in obj:
        raise ConfigError("resources", None, "a list of {resource, subResources, bootstrapRoute}")
    resources = _resources(obj["resources"])

    state_dir = Path(_get(obj, "", "stateDir", ".changefeed", _string))
    if not state_dir.is_absolute():
        state_dir = (base or Path.cwd()) / state_dir

    bucket_obj = _section(obj.get("bucket", {}), "bucket")
    _only(bucket_obj, "bucket.", {"redisUrl", "name", "partitions"})
    server_obj = _section(obj.get("server", {}), "server")
    _only(server_obj, "server.", {"host", "port"})
    limits_obj = _section(obj.get("limits", {}), "limits")
    _only(limits_obj, "limits.", _LIMIT_KEYS)

    defaults = Limits()
    limits = Limits(
        **{
            attr: _get(limits_obj, "limits.", key, getattr(defaults, attr), check)
            for key, (attr, check) in _LIMIT_KEYS.items()
        }
    )
    bounded = (("pageSize", "maxPageSize"), ("results", "maxResults"), ("wait", "maxWait"))
    for small, large in bounded:
        value, bound = (getattr(limits, _LIMIT_KEYS[key][0]) for key in (small, large))
        if value > bound:
            raise ConfigError(f"limits.{small}", value, f"at most limits.{large} ({bound})")

    name = _get(bucket_obj, "bucket.", "name", "changefeed", _name)
    redis_url = bucket_obj.get("redisUrl")
    return Config(
        resources=resources,
        max_age=_get(obj, "", "maxAge", 3600.0, _positive),
        max_items=_get(obj, "", "maxItems", None, _max_items),
        bucket=Bucket(
            None if redis_url is None else _redis_url("bucket.redisUrl", redis_url),
            name,
            _get(bucket_obj, "bucket.", "partitions", 1, _partitions),
        ),
        server=Server(
            _get(server_obj, "server.", "host", "127.0.0.1", _host),
            _get(server_obj, "server.", "port", 8080, _port),
        ),
        limits=limits,
        state_dir=state_dir,
        gc_interval=None
        if obj.get("gcInterval") is None
        else _positive("gcInterval", obj["gcInterval"]),
    )


# --- validators: each takes (key, value) and returns the value or raises ConfigError ---


def _section(value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(key, value, "an object")
    return value


def _only(obj: Mapping[str, Any], prefix: str, allowed: set[str] | Mapping[str, Any]) -> None:
    for key in obj:
        if key not in allowed:
            raise ConfigError(
                prefix + key, obj[key], f"one of the known keys: {', '.join(sorted(allowed))}"
            )


def _get(
    obj: Mapping[str, Any], prefix: str, key: str, default: T, check: Callable[[str, Any], T]
) -> T:
    return check(prefix + key, obj[key]) if key in obj else default


def _string(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, value, "a non-empty string")
    return value


def _name(key: str, value: Any) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigError(key, value, "a name of letters, digits, '_', '.' or '-'")
    return value


def _positive(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(key, value, "a positive number")
    return float(value)


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(key, value, "a positive integer")
    return value


MAX_PARTITIONS = 1024


def _partitions(key: str, value: Any) -> int:
    expected = f"a power of two from 1 to {MAX_PARTITIONS}"
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARTITIONS:
        raise ConfigError(key, value, expected)
    if value & (value - 1):
        raise ConfigError(key, value, expected)
    return value


def _max_items(key: str, value: Any) -> int | None:
    if value is None or value == 0:
        return None
    return _positive_int(key, value)


def _host(key: str, value: Any) -> str:
    return _string(key, value)


def _port(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ConfigError(key, value, "a port number from 0 to 65535 (0: any free port)")
    return value


def _redis_url(key: str, value: Any) -> str:
    expected = "a redis://, rediss:// or unix:// URL, or null for the embedded Redis"
    if not isinstance(value, str):
        raise ConfigError(key, value, expected)
    parts = urlsplit(value)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(key, value, expected)
    if parts.scheme == "unix" and not parts.path:
        raise ConfigError(key, value, "a unix:// URL with a socket path")
    if parts.scheme != "unix" and not parts.hostname:
        raise ConfigError(key, value, "a redis:// URL with a host")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ConfigError(key, value, "a URL with a valid port") from None
    return value


_LIMIT_KEYS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "registrationBytes": ("registration_bytes", _positive_int),
    "registrationTimeout": ("registration_timeout", _positive),
    "pageSize": ("page_size", _positive_int),
    "maxPageSize": ("max_page_size", _positive_int),
    "window": ("window", _positive_int),
    "sendBuffer": ("send_buffer", _positive_int),
    "pingInterval": ("ping_interval", _positive),
    "results": ("results", _positive_int),
    "maxResults": ("max_results", _positive_int),
    "wait": ("wait", _positive),
    "maxWait": ("max_wait", _positive),
}


def _resources(value: Any) -> tuple[Resource, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(
            "resources", value, "a non-empty list of {resource, subResources, bootstrapRoute}"
        )
    seen: dict[str, str] = {}
    routes: dict[str, str] = {}
    out = []
    for i, entry in enumerate(value):
        where = f"resources[{i}]"
        entry = _section(entry, where)
        _only(entry, where + ".", {"resource", "subResources", "bootstrapRoute"})
        for key in ("resource", "subResources", "bootstrapRoute"):
            if key not in entry:
                raise ConfigError(f"{where}.{key}", None, "present")
        name = _name(f"{where}.resource", entry["resource"])
        if name in seen:
            raise ConfigError(
                f"{where}.resource", name, f"a resource not already listed at {seen[name]}"
            )
        seen[name] = where
        subs = entry["subResources"]
        if (
            not isinstance(subs, list)
            or not subs
            or not all(isinstance(s, str) and _NAME.match(s) for s in subs)
        ):
            raise ConfigError(f"{where}.subResources", subs, "a non-empty list of names")
        if len(set(subs)) != len(subs) or WILDCARD in subs:
            raise ConfigError(f"{where}.subResources", subs, "names without duplicates or '*'")
        route = entry["bootstrapRoute"]
        if not isinstance(route, str) or not _ROUTE.match(route) or route.rstrip("/") == "":
            raise ConfigError(f"{where}.bootstrapRoute", route, "an absolute path such as '/vms'")
        route = route.rstrip("/")
        if route == "/changefeeds" or route.startswith("/changefeeds/"):
            raise ConfigError(f"{where}.bootstrapRoute", route, "a path outside /changefeeds")
        if route in routes:
            raise ConfigError(
                f"{where}.bootstrapRoute", route, f"a route not already used by {routes[route]}"
            )
        routes[route] = where
        out.append(Resource(name, tuple(subs), route))
    return tuple(out)
