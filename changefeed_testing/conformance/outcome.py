"""What one conformance check concluded: passed, failed, or could not run, and why."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Status(Enum):
    PASS = "pass"
    FAIL = "FAIL"
    NOT_RUN = "not run"


class Failed(Exception):
    """Raised inside a check: the publisher did not behave as docs/protocol.md says."""


class NotRun(Exception):
    """Raised inside a check: it could not be run against this target (the reason says what
    would let it run, e.g. `--config`)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One check's result: `detail` is what was observed (pass) or what was wrong (fail)."""

    name: str
    group: str
    status: Status
    detail: str
    seconds: float
