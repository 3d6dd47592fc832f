"""The listener's settings: from arguments, or from a section of the service's config.js.

Built by one pure function (`parse_listener_config`) into frozen dataclasses, with the same
rules and messages as the publisher's config.js (`changefeed.configjs`): unknown keys are errors and
every error names the key, the value and what was expected. docs/listener.md lists the keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import json5

from changefeed import configjs as cj
from changefeed.backoff import Backoff
from changefeed.errors import ConfigError

BufferKind = Literal["memory", "redis"]


@dataclass(frozen=True, slots=True)
class BufferConfig:
    """Where change items wait for the application, and how many may wait (RFD 5)."""

    kind: BufferKind = "memory"
    size: int = 10000
    redis_url: str | None = None
    """Required with kind "redis"."""
    key: str | None = None
    """The Redis list's key; None: ``changefeed:listener:<instance>``."""


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    buffer: BufferConfig = field(default_factory=BufferConfig)
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.5, maximum=30.0))
    healthy_after: float = 30.0
    """Seconds a connection must stream before the backoff starts again from `initial`."""
    page_size: int = 100
    heartbeat_interval: float | None = 28.0
    """Seconds between `heartbeat` frames (node-sdc-changefeed sends them); None: never."""
    ping_interval: float | None = 20.0
    """Seconds between websocket pings; None disables dead-connection detection."""
    ping_timeout: float | None = 20.0
    open_timeout: float = 10.0
    """Seconds to connect and get the registration reply."""
    http_timeout: float = 30.0
    """Seconds for one bootstrap page or fetch."""


_TOP_KEYS = {"buffer", "backoff", "healthyAfter", "pageSize", "heartbeatInterval",
             "pingInterval", "pingTimeout", "openTimeout", "httpTimeout"}


def load_listener_config(path: str | Path, section: str | None = None) -> ListenerConfig:
    """Read the listener's settings from a config.js file.

    With `section`, they are the object under that top-level key (the service's own keys around
    it are left alone; a missing section means defaults); without, the whole file is theirs.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError("<file>", str(path), f"a readable config.js ({exc.strerror})",
                          f"cannot read the config file {path}: {exc.strerror}") from None
    return parse_listener_config(text, section)


def parse_listener_config(text: str, section: str | None = None) -> ListenerConfig:
    """Build a ListenerConfig from the text of a config.js."""
    try:
        raw = json5.loads(cj.object_literal(text), allow_duplicate_keys=False)
    except ValueError as exc:
        raise cj.syntax_error(text, exc) from None
    obj = cj.section(raw, "<top level>")
    prefix = ""
    if section is not None:
        obj = cj.section(obj.get(section, {}), section)
        prefix = section + "."
    return listener_config_from(obj, prefix)


def listener_config_from(obj: dict[str, Any], prefix: str = "") -> ListenerConfig:
    """Build a ListenerConfig from an already parsed object (keys are named `prefix` + key)."""
    cj.only(obj, prefix, _TOP_KEYS)
    defaults = ListenerConfig()
    optional = cj.optional_positive
    return ListenerConfig(
        buffer=_buffer(cj.section(obj.get("buffer", {}), prefix + "buffer"), prefix + "buffer."),
        backoff=_backoff(
            cj.section(obj.get("backoff", {}), prefix + "backoff"), prefix + "backoff."
        ),
        healthy_after=cj.get(obj, prefix, "healthyAfter", defaults.healthy_after, cj.positive),
        page_size=cj.get(obj, prefix, "pageSize", defaults.page_size, cj.positive_int),
        heartbeat_interval=cj.get(obj, prefix, "heartbeatInterval", defaults.heartbeat_interval,
                                  optional),
        ping_interval=cj.get(obj, prefix, "pingInterval", defaults.ping_interval, optional),
        ping_timeout=cj.get(obj, prefix, "pingTimeout", defaults.ping_timeout, optional),
        open_timeout=cj.get(obj, prefix, "openTimeout", defaults.open_timeout, cj.positive),
        http_timeout=cj.get(obj, prefix, "httpTimeout", defaults.http_timeout, cj.positive),
    )



def _buffer(obj: dict[str, Any], prefix: str) -> BufferConfig:
    cj.only(obj, prefix, {"kind", "size", "redisUrl", "key"})
    default = BufferConfig()
    kind = obj.get("kind", "memory")
    if kind not in ("memory", "redis"):
        raise ConfigError(prefix + "kind", kind, '"memory" or "redis"')
    redis_url = obj.get("redisUrl")
    if redis_url is not None:
        redis_url = cj.redis_url(prefix + "redisUrl", redis_url)
    elif kind == "redis":
        raise ConfigError(prefix + "redisUrl", None, 'a Redis URL when buffer.kind is "redis"')
    return BufferConfig(
        kind=kind,
        size=cj.get(obj, prefix, "size", default.size, cj.positive_int),
        redis_url=redis_url,
        key=cj.get(obj, prefix, "key", None, cj.name),
    )


def _backoff(obj: dict[str, Any], prefix: str) -> Backoff:
    cj.only(obj, prefix, {"initial", "maximum", "factor", "jitter", "retries"})
    default = ListenerConfig().backoff
    initial = cj.get(obj, prefix, "initial", default.initial, cj.positive)
    maximum = cj.get(obj, prefix, "maximum", max(default.maximum, initial), cj.positive)
    if maximum < initial:
        raise ConfigError(prefix + "maximum", maximum, f"at least {prefix}initial ({initial})")
    factor = cj.get(obj, prefix, "factor", default.factor, cj.positive)
    if factor < 1:
        raise ConfigError(prefix + "factor", factor, "a number >= 1")
    jitter = obj.get("jitter", default.jitter)
    if isinstance(jitter, bool) or not isinstance(jitter, int | float) or not 0 <= jitter <= 1:
        raise ConfigError(prefix + "jitter", jitter, "a number from 0 to 1")
    retries = obj.get("retries")
    if retries is not None and (isinstance(retries, bool) or not isinstance(retries, int)
                                or retries < 0):
        raise ConfigError(prefix + "retries", retries, "a number >= 0, or null to retry for ever")
    return Backoff(initial, maximum, factor, float(jitter), retries)
