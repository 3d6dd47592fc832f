"""Run the checks against a target, one after the other, and collect their outcomes."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from changefeed_testing.conformance import items, registration, resume  # noqa: F401 (checks)
from changefeed_testing.conformance.outcome import Failed, NotRun, Outcome, Status
from changefeed_testing.conformance.target import CHECKS, Check, Target

GROUPS = ("discovery", "registration", "close codes", "bad registrations", "items", "resume")
"""The order groups run in: discovery first, since its `resources` check learns the resources
and sub-resources the other checks register for."""


def checks(only: Sequence[str] = ()) -> list[Check]:
    """Every check in running order (or those named in `only`, and `resources` always)."""
    chosen = [c for c in CHECKS if not only or c.name in only or c.name == "resources"]
    return sorted(chosen, key=lambda c: GROUPS.index(c.group))


@dataclass(frozen=True, slots=True)
class Report:
    """Every check's outcome for one target."""

    url: str
    resource: str
    outcomes: tuple[Outcome, ...]
    probes: tuple[str, ...] = ()
    """The ids of the changes of `resource` the checks caused (committed into the live
    bucket, and sent to its listeners)."""

    def count(self, status: Status) -> int:
        return sum(1 for outcome in self.outcomes if outcome.status is status)

    @property
    def passed(self) -> bool:
        """True when no check failed (checks that could not run do not fail the run)."""
        return self.count(Status.FAIL) == 0


async def run_check(target: Target, check: Check) -> Outcome:
    """One check, timed. Failed and NotRun become its outcome; so does any other error (a
    peer that breaks the websocket client, or a bug in a check), as a failure that says so."""
    started = time.monotonic()
    try:
        detail = await check.run(target)
        status = Status.PASS
    except Failed as exc:
        detail, status = str(exc), Status.FAIL
    except NotRun as exc:
        detail, status = str(exc), Status.NOT_RUN
    except Exception as exc:  # reported, never hidden: the peer broke our client, or a bug
        detail, status = f"unexpected error: {exc!r}", Status.FAIL
    return Outcome(check.name, check.group, status, detail, time.monotonic() - started)


async def run_checks(target: Target, only: Sequence[str] = ()) -> Report:
    """Run every check (or those named in `only`, plus `resources`) against `target`."""
    outcomes = [await run_check(target, check) for check in checks(only)]
    return Report(target.url, target.resource, tuple(outcomes), tuple(target.probes))

