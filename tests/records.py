"""The records the client libraries log (changefeed/logs.py), captured for a test.

    with logged("listener") as logs:
        ...
    assert [entry["event"] for entry in logs] == [...]

Each entry is a dict like structlog.testing.capture_logs()'s: `event`, `log_level`, `logger` and
the event's fields.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.entries: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "fields", {})
        self.entries.append({**fields, "event": getattr(record, "event", record.getMessage()),
                             "log_level": record.levelname.lower(), "logger": record.name})


@contextlib.contextmanager
def logged(name: str = "listener", level: int = logging.DEBUG) -> Iterator[list[dict[str, Any]]]:
    """The records of `logging.getLogger(name)` and its children at `level` and above while
    inside (the logger's level is lowered to `level` meanwhile, and restored after)."""
    logger = logging.getLogger(name)
    handler = _Collect()
    before = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield handler.entries
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)
