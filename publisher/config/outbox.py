"""config.js's `outbox` key: the PostgreSQL outbox the publisher relays (docs/postgres.md).

Pure code, as the rest of config/: the URL's environment variable or file is only named here;
the entry point reads it (`Outbox.url`). Nothing secret is put into an error or a log line: a
URL is shown with its password masked.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from changefeed import configjs as cj
from changefeed.errors import ConfigError
from publisher.config.extras import POSTGRES, require

KEY = "outbox"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SOURCES = ("postgres", "postgresEnv", "postgresFile")
"""The keys that say where a section's PostgreSQL URL is (one of them)."""


@dataclass(frozen=True, slots=True)
class Outbox:
    """Where the outbox is and how the relay reads it."""

    postgres: str | None = None
    """The URL written in config.js (else one of the next two names where it is)."""
    postgres_env: str | None = None
    postgres_file: Path | None = None
    snapshots: tuple[tuple[str, str], ...] = ()
    """(resource, snapshot query) pairs: what a re-seed of the store reads (`SELECT id,
    state`)."""
    poll_interval: float = 1.0
    """Seconds between two reads of the outbox when no notification came (the safety net)."""
    batch: int = 1000
    """Rows read (and relayed) at most per round."""
    takeover_interval: float = 1.0
    """Seconds between two attempts of a standby relay to take the relay's lock."""
    keep_relayed: float = 300.0
    """Seconds a relayed row's cursor stays readable (`outbox.cursor`)."""
    max_dead_rows: int = 10000
    """Dead rows kept at most (the oldest go first)."""

    def url(self, environ: Mapping[str, str] | None = None) -> str:
        """The PostgreSQL URL, read from the environment or the file when config.js names one.
        Raises ConfigError (the URL never shown) when it is missing or unreadable."""
        return source_url(KEY, self.postgres, self.postgres_env, self.postgres_file, environ)

    @property
    def display_url(self) -> str:
        """Where the URL comes from, for logs (a written URL with its password masked)."""
        return display_source(self.postgres, self.postgres_env, self.postgres_file)

    @property
    def snapshot(self) -> dict[str, str]:
        return dict(self.snapshots)


def source_url(
    key: str, postgres: str | None, env: str | None, file: Path | None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """The URL of section `key`'s postgres (written), postgresEnv or postgresFile (read now)."""
    if postgres is not None:
        return postgres
    if env is not None:
        value = (os.environ if environ is None else environ).get(env)
        if not value:
            raise ConfigError(f"{key}.postgresEnv", env, "a variable set in the environment")
        return postgres_url(f"${env}", value.strip())
    assert file is not None
    try:
        text = file.read_text().strip()
    except OSError as exc:
        raise ConfigError(
            f"{key}.postgresFile", str(file), f"a readable file ({exc.strerror})"
        ) from None
    return postgres_url(str(file), text)


def display_source(postgres: str | None, env: str | None, file: Path | None) -> str:
    """Where a section's URL comes from, for logs (a written URL with its password masked)."""
    if postgres is not None:
        return cj.masked_url(postgres)
    if env is not None:
        return f"${env}"
    return str(file)


def parse_source(section: Mapping[str, Any], key: str, base: Path) -> dict[str, Any]:
    """The fields (postgres, postgres_env, postgres_file) of section `key`'s one URL source."""
    given = [source for source in SOURCES if section.get(source) is not None]
    if len(given) != 1:
        raise ConfigError(key, "{...}", "exactly one of postgres, postgresEnv, postgresFile")
    source = given[0]
    value = section[source]
    if source == "postgres":
        return {"postgres": postgres_url(f"{key}.postgres", value)}
    if source == "postgresEnv":
        if not isinstance(value, str) or not _ENV_NAME.match(value):
            raise ConfigError(f"{key}.postgresEnv", value, "the name of an environment variable")
        return {"postgres_env": value}
    path = Path(cj.string(f"{key}.postgresFile", value))
    return {"postgres_file": path if path.is_absolute() else base / path}


def postgres_url(key: str, value: Any) -> str:
    """A postgresql:// (or postgres://) URL; errors show it with its password masked."""
    expected = "a postgresql:// URL, e.g. postgresql://user@host:5432/db"
    if not isinstance(value, str):
        raise ConfigError(key, "<not shown>", expected)
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ConfigError(key, cj.masked_url(value), "a URL with a valid port") from None
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError(key, cj.masked_url(value), expected)
    return value


def parse_outbox(obj: Mapping[str, Any], resources: set[str], base: Path) -> Outbox | None:
    """The `outbox` section of config.js's top level `obj` (None when absent); `resources` are
    the configured resource names, `base` what a relative postgresFile resolves against."""
    raw = obj.get(KEY)
    if raw is None:
        return None
    require(KEY, POSTGRES)
    section = cj.section(raw, KEY)
    cj.only(section, KEY + ".", {*SOURCES, "resources", "pollInterval", "batch",
                                 "takeoverInterval", "keepRelayed", "maxDeadRows"})
    fields = parse_source(section, KEY, base)
    fields["snapshots"] = _snapshots(section.get("resources", {}), resources)
    for key, attr, check in (
        ("pollInterval", "poll_interval", cj.positive),
        ("batch", "batch", cj.positive_int),
        ("takeoverInterval", "takeover_interval", cj.positive),
        ("keepRelayed", "keep_relayed", cj.positive),
        ("maxDeadRows", "max_dead_rows", cj.positive_int),
    ):
        if key in section:
            fields[attr] = check(f"{KEY}.{key}", section[key])
    return Outbox(**fields)


def _snapshots(value: Any, resources: set[str]) -> tuple[tuple[str, str], ...]:
    section = cj.section(value, f"{KEY}.resources")
    out = []
    for name, entry in section.items():
        where = f"{KEY}.resources.{name}"
        if name not in resources:
            known = ", ".join(sorted(resources))
            raise ConfigError(where, "{...}", f"a configured resource ({known})")
        entry = cj.section(entry, where)
        cj.only(entry, where + ".", {"snapshot"})
        query = entry.get("snapshot")
        if not isinstance(query, str) or not query.strip():
            raise ConfigError(
                f"{where}.snapshot", query, "a query returning (id text, state jsonb) rows"
            )
        out.append((name, query))
    return tuple(out)
