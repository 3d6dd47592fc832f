"""config.js: parsed by one pure function into frozen dataclasses.

The file is a JavaScript object literal (comments, unquoted keys, trailing commas), optionally
written as ``module.exports = { ... };``. Unknown keys are errors; every error names the key, the
value and what was expected. docs/config.md describes every key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import json5

from changefeed import configjs as cj
from changefeed import longpoll
from changefeed.errors import ConfigError
from changefeed.protocol import Resource
from publisher.bucket.redis.cluster_url import cluster_section
from publisher.bucket.redis.sentinel import redis_url as any_redis_url
from publisher.bucket.redis.sentinel import sentinel_section
from publisher.config.capture import Capture, parse_capture
from publisher.config.checks import (
    BUCKET_KEYS,
    DISCOVERY_KEYS,
    DURABLE_KEYS,
    FEED_KEYS,
    FLEET_KEYS,
    HEALTH_KEYS,
    LIMIT_KEYS,
    LOG_LEVELS,
    MAX_PARTITIONS,
    MAX_TRACE_ITEMS,
    SERVER_KEYS,
    TRACE_KEYS,
    IPNetwork,
    log_level,
    max_items,
    resources_of,
    section_of,
)
from publisher.config.outbox import Outbox, parse_outbox
from publisher.config.scopes import DURABLE_PREFIX
from publisher.config.security import SECURITY_KEYS, Security, parse_security


@dataclass(frozen=True, slots=True)
class Server:
    """Where the publisher listens, and what one connection, or one client, may hold."""

    host: str = "127.0.0.1"
    port: int = 8080
    max_connections: int = 10000
    """Open connections at most, of every client (lowered to fit the open-file limit)."""
    max_connections_per_client: int = 1000
    """Open connections at most from one client address."""
    idle_timeout: float = 75.0
    """Seconds a connection may wait without a request in progress: idle between requests, or
    still sending the head of its request. Then it is closed."""
    body_timeout: float = 10.0
    """Seconds a request body may take to arrive (then 408)."""
    max_body_bytes: int = 65536
    """Largest request body accepted (a larger one is a 413)."""
    trusted_proxies: tuple[IPNetwork, ...] = ()
    """Peers whose X-Forwarded-For is believed (`publisher.security.clientaddr`); empty:
    nobody's."""


@dataclass(frozen=True, slots=True)
class Bucket:
    """Where the change bucket and the store live."""

    redis_url: str | None = None
    """None: start an embedded redis-server under the state directory."""
    name: str = "changefeed"
    """Key prefix of every Redis key of this bucket."""
    partitions: int = 1
    """Streams the log is split into (a power of two), fixed when the bucket is created."""
    pool_size: int = 64
    """Redis connections the publisher's requests share (the tail has its own)."""
    pool_timeout: float = 5.0
    """Seconds a request waits for a free Redis connection before it is refused as overload."""

    @property
    def display_url(self) -> str | None:
        """The Redis URL with any password masked, for logs."""
        if self.redis_url is None:
            return None
        return cj.masked_url(self.redis_url)


@dataclass(frozen=True, slots=True)
class Feed:
    """Cursor sets the feed stores for its consumers (docs/pull.md)."""

    consumers: frozenset[str] = frozenset()
    """The consumers whose cursors may be stored; empty: storing is refused for all."""
    cursor_set_max_age: float = 7 * 86400.0
    """Seconds a cursor set lives after it was last stored."""
    max_cursor_sets: int = 16
    """Cursor sets one consumer may have at a time."""


@dataclass(frozen=True, slots=True)
class Durable:
    """Durable pull consumers (docs/pull.md#durable-consumers): which may exist, and bounds on
    what each may make the publisher keep in Redis."""

    consumers: frozenset[str] = frozenset()
    """The names a durable consumer may have; empty: durable consumers are refused."""
    max_ack_pending: int = 10000
    """The highest `max_ack_pending` a consumer may ask for (items handed out, unsettled)."""
    max_ack_wait: float = 86400.0
    """The longest `ack_wait`, and nak `delay`, a consumer may ask for (seconds)."""
    max_dead_letters: int = 10000
    """Dead-letter records kept per consumer (the oldest go first)."""


@dataclass(frozen=True, slots=True)
class Limits:
    registration_bytes: int = 65536
    registration_timeout: float = 10.0
    page_size: int = 100
    max_page_size: int = 1000
    window: int = 10000
    send_buffer: int = 1 << 20
    coalesce_ids: int = 10000
    """Distinct ids a slow listener's coalesced catch-up may hold (docs/protocol.md#coalesced-
    catch-up); past them it is closed with 4008."""
    ping_interval: float = 20.0
    results: int = longpoll.DEFAULT_RESULTS
    """Items in an `events` reply or a feed response when the client names no number."""
    max_results: int = longpoll.MAX_RESULTS
    wait: float = longpoll.DEFAULT_WAIT
    """Seconds a long poll waits when the client names no wait time."""
    max_wait: float = longpoll.MAX_WAIT


@dataclass(frozen=True, slots=True)
class Health:
    """When `/readyz` says ready (docs/operations.md#health)."""

    max_lag_items: int = 1000
    """Log items the tail may be behind the bucket's head and still be ready."""
    max_lag_seconds: float = 30.0
    """Seconds (of commit time) the tail may be behind the bucket's head and still be ready."""
    drain_delay: float = 0.0
    """Seconds between SIGTERM (`/readyz` answers 503 from then on) and closing listeners, for
    load balancers to stop sending new ones here."""


@dataclass(frozen=True, slots=True)
class Fleet:
    """How the publisher advertises itself in Redis for `/changefeeds/stats?scope=fleet`."""

    interval: float = 5.0
    """Seconds between two advertisements."""
    ttl: float = 15.0
    """Seconds an advertisement lives: a publisher that died disappears within it."""


@dataclass(frozen=True, slots=True)
class Trace:
    """The per-change delivery trace (publisher.delivery.trace, `changefeed trace`)."""

    items: int = 10000
    """Changes traced at most (the newest); 0: no trace is recorded."""
    max_age: float | None = 600.0
    """Seconds a change stays traced after its read; None (0 in config.js): no age limit."""

    @property
    def enabled(self) -> bool:
        return self.items > 0


@dataclass(frozen=True, slots=True)
class Discovery:
    """`GET /changefeeds` without an upgrade (publisher.web.discovery)."""

    default_version: str | None = None
    """The node-sdc-changefeed version (`1.0` to `1.5`) whose shape a request without
    `Accept-Version` gets, for clients of a Joyent 1.x publisher; None: RFD 5's shape."""


@dataclass(frozen=True, slots=True)
class Config:
    resources: tuple[Resource, ...]
    max_age: float = 3600.0
    max_items: int | None = None
    """Most items the log retains (the oldest beyond it are trimmed); None: no limit."""
    bucket: Bucket = field(default_factory=Bucket)
    server: Server = field(default_factory=Server)
    limits: Limits = field(default_factory=Limits)
    feed: Feed = field(default_factory=Feed)
    durable: Durable = field(default_factory=Durable)
    state_dir: Path = Path(".changefeed")
    gc_interval: float | None = None
    """Seconds between trims; None derives it from maxAge (a tenth, between 1 s and 60 s)."""
    security: Security = field(default_factory=Security)
    """auth, tls, allowedOrigins, clientLimits (publisher.config.security)."""
    health: Health = field(default_factory=Health)
    fleet: Fleet = field(default_factory=Fleet)
    trace: Trace = field(default_factory=Trace)
    discovery: Discovery = field(default_factory=Discovery)
    log_level: str | None = None
    """`logLevel`; None: the command line's (`--log-level`, default info)."""
    outbox: Outbox | None = None
    """The PostgreSQL outbox this publisher relays (publisher.config.outbox); None: none."""
    capture: Capture | None = None
    """The PostgreSQL tables this publisher captures (publisher.config.capture); None: none."""

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
            server = dataclasses.replace(server, host=cj.host("--host", host))
        if port is not None:
            server = dataclasses.replace(server, port=cj.port("--port", port))
        bucket = self.bucket
        if redis_url is not None:
            bucket = dataclasses.replace(bucket, redis_url=any_redis_url("--redis-url", redis_url))
        return dataclasses.replace(self, server=server, bucket=bucket)


def load_config(path: str | Path) -> Config:
    """Read and validate a config.js file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError("<file>", str(path), f"a readable config.js ({exc.strerror})",
                          f"cannot read the config file {path}: {exc.strerror}") from None
    return parse_config(text, base=path.resolve().parent, source=str(path))


def parse_config(text: str, base: Path | None = None, source: str | None = None) -> Config:
    """Build a Config from the text of a config.js; relative paths resolve against `base`.
    `source` (the file's name) is named in a syntax error, with the line."""
    obj = _top_level(text, source)
    if "resources" not in obj:
        raise ConfigError("resources", None, "a list of {resource, subResources, bootstrapRoute}")
    resources = resources_of(obj["resources"])
    state_dir = Path(cj.get(obj, "", "stateDir", ".changefeed", cj.string))
    if not state_dir.is_absolute():
        state_dir = (base or Path.cwd()) / state_dir
    bucket_obj = cj.section(obj.get("bucket", {}), "bucket")
    limits = section_of(obj, "limits", Limits, LIMIT_KEYS)
    server = _server(obj)
    feed = section_of(obj, "feed", Feed, FEED_KEYS)
    durable = section_of(obj, "durable", Durable, DURABLE_KEYS)
    _check_bounds(limits)
    bucket = _bucket(obj, bucket_obj)
    return Config(
        resources=resources,
        max_age=cj.get(obj, "", "maxAge", 3600.0, cj.positive),
        max_items=cj.get(obj, "", "maxItems", None, max_items),
        bucket=bucket,
        server=server,
        limits=limits,
        feed=feed,
        durable=durable,
        state_dir=state_dir,
        gc_interval=None
        if obj.get("gcInterval") is None
        else cj.positive("gcInterval", obj["gcInterval"]),
        security=parse_security(
            obj, [r.resource for r in resources],
            feed.consumers | {DURABLE_PREFIX + name for name in durable.consumers},
            base or Path.cwd(),
        ),
        outbox=parse_outbox(obj, {r.resource for r in resources}, base or Path.cwd()),
        capture=parse_capture(obj, {r.resource: r.sub_resources for r in resources},
                              bucket.name, base or Path.cwd()),
        **_operations(obj),
    )


def _top_level(text: str, source: str | None) -> dict[str, Any]:
    """The object of a config.js, with no key the publisher does not know."""
    try:
        raw = json5.loads(cj.object_literal(text), allow_duplicate_keys=False)
    except ValueError as exc:
        raise cj.syntax_error(text, exc, source) from None
    obj = cj.section(raw, "<top level>")
    cj.only(
        obj,
        "",
        {"resources", "maxAge", "maxItems", "bucket", "server", "limits", "feed", "durable",
         "stateDir",
         "gcInterval", "outbox", "capture", *SECURITY_KEYS, *_OPERATIONS_KEYS},
    )
    return obj


def _server(obj: dict[str, Any]) -> Server:
    server = section_of(obj, "server", Server, SERVER_KEYS)
    if server.max_connections_per_client > server.max_connections:
        raise ConfigError(
            "server.maxConnectionsPerClient",
            server.max_connections_per_client,
            f"at most server.maxConnections ({server.max_connections})",
        )
    return server


def _check_bounds(limits: Limits) -> None:
    """Each default of `limits` at most its bound (pageSize and maxPageSize, ...)."""
    bounded = (("pageSize", "maxPageSize"), ("results", "maxResults"), ("wait", "maxWait"))
    for small, large in bounded:
        value, bound = (getattr(limits, LIMIT_KEYS[key][0]) for key in (small, large))
        if value > bound:
            raise ConfigError(f"limits.{small}", value, f"at most limits.{large} ({bound})")


def _bucket(obj: dict[str, Any], bucket_obj: dict[str, Any]) -> Bucket:
    """The `bucket` section: its Redis is one of `redisUrl`, `sentinel` or `cluster`."""
    redis_url = bucket_obj.get("redisUrl")
    if redis_url is not None:
        redis_url = any_redis_url("bucket.redisUrl", redis_url)
    if bucket_obj.get("sentinel") is not None:
        if redis_url is not None:
            raise ConfigError(
                "bucket.sentinel", "{...}", "no bucket.redisUrl beside it (one or the other)"
            )
        redis_url = sentinel_section("bucket.sentinel", bucket_obj["sentinel"])
    if bucket_obj.get("cluster") is not None:
        beside = [k for k in ("redisUrl", "sentinel") if bucket_obj.get(k) is not None]
        if beside:
            raise ConfigError(
                "bucket.cluster", "[...]", f"no bucket.{beside[0]} beside it (one or the other)"
            )
        redis_url = cluster_section("bucket.cluster", bucket_obj["cluster"])
    return dataclasses.replace(
        section_of(obj, "bucket", Bucket, BUCKET_KEYS, {"redisUrl", "sentinel", "cluster"}),
        redis_url=redis_url,
    )


# --- what operators run the publisher with: health, fleet advertising, log level ---

_OPERATIONS_KEYS = ("health", "fleet", "trace", "discovery", "logLevel")


def _operations(obj: dict[str, Any]) -> dict[str, Any]:
    """The Config fields of the top-level keys `health`, `fleet`, `trace`, `discovery` and
    `logLevel`."""
    fleet = section_of(obj, "fleet", Fleet, FLEET_KEYS)
    if fleet.ttl <= fleet.interval:
        raise ConfigError("fleet.ttl", fleet.ttl, f"more than fleet.interval ({fleet.interval:g})")
    return {
        "health": section_of(obj, "health", Health, HEALTH_KEYS),
        "fleet": fleet,
        "trace": section_of(obj, "trace", Trace, TRACE_KEYS),
        "discovery": section_of(obj, "discovery", Discovery, DISCOVERY_KEYS),
        "log_level": cj.get(obj, "", "logLevel", None, log_level),
    }


__all__ = [
    "LOG_LEVELS",
    "MAX_PARTITIONS",
    "MAX_TRACE_ITEMS",
    "Bucket",
    "Config",
    "Discovery",
    "Durable",
    "Feed",
    "Fleet",
    "Health",
    "IPNetwork",
    "Limits",
    "Server",
    "Trace",
    "load_config",
    "parse_config",
]
