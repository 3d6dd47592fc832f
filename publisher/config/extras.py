"""The optional extras a config.js section needs (`pip install 'changefeed[postgres]'`), and
the error that names the one to install when its driver is missing."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from changefeed.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Extra:
    """An optional extra of the package and the modules it brings."""

    name: str
    modules: tuple[str, ...]


POSTGRES = Extra("postgres", ("asyncpg", "psycopg2"))
"""The PostgreSQL drivers: asyncpg (the outbox relay) and psycopg2 (the capture's logical
replication)."""


def require(key: str, extra: Extra) -> None:
    """Raise ConfigError naming config.js's `key` and the extra to install when one of the
    extra's modules cannot be imported."""
    for module in extra.modules:
        try:
            importlib.import_module(module)
        except ImportError:
            raise ConfigError(
                key, "{...}",
                f"the {extra.name!r} extra installed: pip install 'changefeed[{extra.name}]' "
                f"({module} is missing)",
            ) from None
