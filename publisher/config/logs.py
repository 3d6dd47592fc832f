"""structlog set-up for the command line: JSON lines when not on a terminal, pretty otherwise.

Only entry points call `configure`; library modules just `structlog.get_logger(__name__)`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

import structlog

from changefeed.logs import event_fields

LEVELS = ("debug", "info", "warning", "error", "critical")
_level = [logging.INFO]
"""The level below which events are dropped; `set_level` changes it while the process runs
(SIGHUP), for structlog's loggers and the standard library's alike."""


_METHOD_LEVELS = {
    "debug": logging.DEBUG, "info": logging.INFO, "msg": logging.INFO, "warning": logging.WARNING,
    "warn": logging.WARNING, "error": logging.ERROR, "exception": logging.ERROR,
    "critical": logging.CRITICAL, "fatal": logging.CRITICAL,
}


def _below_level(
    logger: object, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    if _METHOD_LEVELS.get(method, logging.INFO) < _level[0]:
        raise structlog.DropEvent
    return event


def set_level(level: str) -> None:
    """Log events of `level` and above from now on (one of `LEVELS`)."""
    number = logging.getLevelName(level.upper())
    _level[0] = number
    logging.getLogger().setLevel(number)


def configure(json: bool | None = None, level: str = "info") -> None:
    """structlog for every event of the process: ours, and the records of libraries that use the
    standard `logging` module (aiohttp's, asyncio's, the listener library's), rendered alike with a
    `logger` field."""
    if json is None:
        json = not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
    ]
    # The list instance stays the same: loggers cached on their first use hold it, so a second
    # configure() in one process (the command run in-process, as the tests do) reaches them too.
    processors = structlog.get_config()["processors"]
    processors[:] = [_below_level, *shared, renderer]
    structlog.configure(
        processors=processors,
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, event_fields, *shared],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    logging.captureWarnings(True)
    set_level(level)


class Throttle:
    """At most one log line per key (a client address, a kind of refusal) per `interval` seconds,
    for events that come in floods.

    `allow(key)` returns None to stay silent, else how many events of `key` were suppressed since
    its last line (0 for the first). Keys not seen for an interval are forgotten, so a flood from
    many addresses costs at most one entry per address and interval.
    """

    def __init__(
        self, interval: float, clock: Callable[[], float] = time.monotonic, most: int = 10000
    ) -> None:
        self.interval = interval
        self._clock = clock
        self._most = most
        self._last: dict[str, tuple[float, int]] = {}

    def allow(self, key: str) -> int | None:
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last[0] < self.interval:
            self._last[key] = (last[0], last[1] + 1)
            return None
        if len(self._last) >= self._most:
            self._forget(now)
        self._last[key] = (now, 0)
        return 0 if last is None else last[1]

    def _forget(self, now: float) -> None:
        stale = [k for k, (at, _) in self._last.items() if now - at >= self.interval]
        for key in stale or list(self._last)[: len(self._last) // 2]:
            del self._last[key]
