"""config.js's `capture` key: the PostgreSQL tables whose row changes the publisher streams
into the bucket by logical replication (docs/capture.md).

Pure code, as the rest of config/: the URL's environment variable or file is only named here
(publisher.config.outbox's `source_url` reads it for the entry point).

    capture: {
      postgres: "postgresql://changefeed@127.0.0.1:5432/vmapi",  // or postgresEnv / postgresFile
      slot: "changefeed", publication: "changefeed",  // default: changefeed_<bucket name>
      tables: {
        "public.vms": {resource: "vm", id: "uuid", subResources: {nic: ["nics"]}},
        "public.vmapi_vms": {resource: "vm", moray: true, subResources: {state: ["state"]}},
      },
    }
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from changefeed import configjs as cj
from changefeed.errors import ConfigError
from publisher.config.extras import POSTGRES, require
from publisher.config.outbox import SOURCES, display_source, parse_source, source_url

KEY = "capture"
MORAY_ID = "_key"
"""The id column of a Moray bucket's table."""
MORAY_VALUE = "_value"
"""The column of a Moray bucket's table that holds the object's JSON."""
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_$]*$")
"""A PostgreSQL identifier that needs no quoting (what slot and publication names are)."""


@dataclass(frozen=True, slots=True)
class Table:
    """How one table's rows become one resource's changes."""

    schema: str
    name: str
    resource: str
    id: str
    """The column whose text is the changed resource's id (`_key` for a Moray table)."""
    sub_resources: tuple[tuple[str, tuple[str, ...]], ...]
    """(sub-resource, the columns (a Moray object's top-level keys) whose change it announces)."""
    moray: bool = False

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def quoted(self) -> str:
        """The table's name for SQL."""
        return f'"{self.schema}"."{self.name}"'

    @property
    def mapped_columns(self) -> set[str]:
        """The columns the mapping reads: what a DDL change may not take away."""
        if self.moray:
            return {MORAY_ID, MORAY_VALUE}
        return {self.id} | {c for _, columns in self.sub_resources for c in columns}


@dataclass(frozen=True, slots=True)
class Capture:
    """Where PostgreSQL is, its slot and publication, and the tables the publisher streams."""

    slot: str
    publication: str
    tables: tuple[Table, ...]
    postgres: str | None = None
    postgres_env: str | None = None
    postgres_file: Path | None = None
    takeover_interval: float = 1.0
    """Seconds between two attempts of a standby publisher to take the capture over."""
    status_interval: float = 1.0
    """Seconds between two standby status messages to PostgreSQL (and lag reads)."""

    def url(self, environ: Mapping[str, str] | None = None) -> str:
        """The PostgreSQL URL (read from the environment or the file when config.js names one)."""
        return source_url(KEY, self.postgres, self.postgres_env, self.postgres_file, environ)

    @property
    def display_url(self) -> str:
        return display_source(self.postgres, self.postgres_env, self.postgres_file)

    def table(self, qualified: str) -> Table | None:
        return next((t for t in self.tables if t.qualified == qualified), None)


def default_name(bucket: str) -> str:
    """The slot's and publication's name when config.js names none: changefeed_<bucket>, in the
    letters PostgreSQL allows (lower case, digits, '_'; at most 63)."""
    return ("changefeed_" + re.sub(r"[^a-z0-9_]", "_", bucket.lower()))[:63]


def parse_capture(
    obj: Mapping[str, Any], resources: Mapping[str, Sequence[str]], bucket: str, base: Path
) -> Capture | None:
    """The `capture` section of config.js's top level `obj` (None when absent); `resources`
    maps each configured resource to its sub-resources, `bucket` is the bucket's name."""
    raw = obj.get(KEY)
    if raw is None:
        return None
    require(KEY, POSTGRES)
    section = cj.section(raw, KEY)
    cj.only(section, KEY + ".", {*SOURCES, "slot", "publication", "tables", "takeoverInterval",
                                 "statusInterval"})
    fields: dict[str, Any] = parse_source(section, KEY, base)
    for key in ("slot", "publication"):
        value = section.get(key, default_name(bucket))
        if not isinstance(value, str) or not _IDENTIFIER.match(value) or len(value) > 63:
            raise ConfigError(f"{KEY}.{key}", value,
                              "a name of lower-case letters, digits and '_' (at most 63)")
        fields[key] = value
    for key, attr in (("takeoverInterval", "takeover_interval"),
                      ("statusInterval", "status_interval")):
        if key in section:
            fields[attr] = cj.positive(f"{KEY}.{key}", section[key])
    tables = cj.section(section.get("tables"), f"{KEY}.tables")
    if not tables:
        raise ConfigError(f"{KEY}.tables", tables, "at least one table")
    fields["tables"] = tuple(_table(name, entry, resources) for name, entry in tables.items())
    return Capture(**fields)


def _table(name: str, entry: Any, resources: Mapping[str, Sequence[str]]) -> Table:
    where = f"{KEY}.tables.{name}"
    schema, dot, table = name.rpartition(".")
    if not table or (dot and not schema):
        raise ConfigError(f"{KEY}.tables", name, "a table name, schema.table or table")
    entry = cj.section(entry, where)
    cj.only(entry, where + ".", {"resource", "id", "subResources", "moray"})
    resource = entry.get("resource")
    if resource not in resources:
        known = ", ".join(sorted(resources))
        raise ConfigError(f"{where}.resource", resource, f"a configured resource ({known})")
    moray = entry.get("moray", False)
    if not isinstance(moray, bool):
        raise ConfigError(f"{where}.moray", moray, "true or false")
    if moray and "id" in entry:
        raise ConfigError(f"{where}.id", entry["id"], f"no id: a Moray table's is {MORAY_ID}")
    id = MORAY_ID if moray else cj.string(f"{where}.id", entry.get("id"))
    subs = cj.section(entry.get("subResources", {}), f"{where}.subResources")
    mapped = []
    for sub, columns in subs.items():
        if sub not in resources[resource]:
            raise ConfigError(f"{where}.subResources.{sub}", columns,
                              f"a sub-resource of {resource} ({', '.join(resources[resource])})")
        if (not isinstance(columns, list) or not columns
                or not all(isinstance(c, str) and c for c in columns)):
            raise ConfigError(f"{where}.subResources.{sub}", columns,
                              "a list of column names" + (" (keys of _value)" if moray else ""))
        mapped.append((sub, tuple(columns)))
    return Table(schema or "public", table, resource, id, tuple(mapped), moray)
