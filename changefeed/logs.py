"""How the client libraries log: through the standard `logging` module, never on stdout.

    log = get_logger(__name__)                   # over the logging.Logger "listener.client"
    log.bind(url=url).info("registered", resumed=True)

The listener library (`listener`) and the testing kit (`changefeed_testing`) log this way, so
that their records go where the application's logging configuration sends them:
`logging.basicConfig(level=logging.WARNING)` or a level on `logging.getLogger("listener")`
silences the debug and info ones; an application that configures nothing sees only warnings and
errors, on stderr (the standard library's last resort). A record's message is the event and its
fields (``registered resumed=True url=http://...``); the event and the fields are also on the
record, as `record.event` and `record.fields`, for a handler that wants them apart.

An application that renders the standard library's records with structlog
(`structlog.stdlib.ProcessorFormatter`) puts `event_fields` into its `foreign_pre_chain`: the
record then comes out as the event with its fields, like one of its own (the publisher's command
line does: publisher/config/logs.py).
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

_CALLER = 2
"""`stacklevel` that names the module calling `log.info(...)` as the record's origin."""


class Log:
    """A `logging.Logger` with structlog's manner: an event and its fields, and context bound
    once (`bind`) for every event after."""

    __slots__ = ("_context", "logger")

    def __init__(self, logger: logging.Logger, context: dict[str, Any] | None = None) -> None:
        self.logger = logger
        self._context = context or {}

    def bind(self, **fields: Any) -> Log:
        """This log with `fields` added to every event."""
        return Log(self.logger, {**self._context, **fields})

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """An error with the traceback of the exception being handled."""
        self._log(logging.ERROR, event, fields, exc_info=True)

    def _log(self, level: int, event: str, fields: dict[str, Any], exc_info: bool = False) -> None:
        if not self.logger.isEnabledFor(level):
            return
        fields = {**self._context, **fields}
        text = " ".join([event, *(f"{key}={_shown(value)}" for key, value in fields.items())])
        self.logger.log(level, "%s", text, exc_info=exc_info, stacklevel=_CALLER + 1,
                        extra={"event": event, "fields": fields})


def _shown(value: Any) -> str:
    """A field's value in a message: a word as it is, anything else as its repr."""
    if isinstance(value, str) and value and not any(c.isspace() or c in "='\"" for c in value):
        return value
    return repr(value)


def get_logger(name: str) -> Log:
    """The log of `logging.getLogger(name)` (a module's `__name__`)."""
    return Log(logging.getLogger(name))


def event_fields(
    logger: Any, method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A structlog processor for `ProcessorFormatter(foreign_pre_chain=[...])`: a record of a
    `Log` becomes its event and fields again (other records pass unchanged)."""
    record = event_dict.get("_record")
    fields = getattr(record, "fields", None)
    if isinstance(fields, dict):
        event_dict.update(fields)
        event_dict["event"] = getattr(record, "event", event_dict.get("event"))
    return event_dict


__all__ = ["Log", "event_fields", "get_logger"]
