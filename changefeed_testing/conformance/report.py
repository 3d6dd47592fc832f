"""The conformance report: a text table for people, JSON for programs."""

from __future__ import annotations

from typing import Any

import orjson

from changefeed_testing.conformance.outcome import Status
from changefeed_testing.conformance.run import Report


def summary(report: Report) -> str:
    passed, failed, not_run = (report.count(s) for s in (Status.PASS, Status.FAIL, Status.NOT_RUN))
    verdict = "conforms" if report.passed else "does NOT conform"
    return (f"{len(report.outcomes)} checks: {passed} passed, {failed} failed, {not_run} not run"
            f" -- {report.url} {verdict}")


def text(report: Report, width: int = 160) -> str:
    """One line per check: group, name, result, seconds, and what was seen or wrong."""
    lines = [f"changefeed conformance {report.url} (resource {report.resource})", ""]
    name_width = max(len(o.name) for o in report.outcomes) if report.outcomes else 10
    group = ""
    for outcome in report.outcomes:
        if outcome.group != group:
            group = outcome.group
            lines.append(group)
        head = (f"  {outcome.name:<{name_width}}  {outcome.status.value:<7}  "
                f"{outcome.seconds:5.2f}s  ")
        detail = outcome.detail
        room = max(20, width - len(head))
        if outcome.status is Status.PASS and len(detail) > room:
            detail = detail[: room - 3] + "..."
        lines.append(head + detail)
    lines += ["", summary(report)]
    return "\n".join(lines)


def as_json(report: Report) -> str:
    body: dict[str, Any] = {
        "url": report.url,
        "resource": report.resource,
        "passed": report.passed,
        "counts": {s.name.lower(): report.count(s) for s in Status},
        "checks": [
            {"name": o.name, "group": o.group, "status": o.status.name.lower(),
             "detail": o.detail, "seconds": round(o.seconds, 3)}
            for o in report.outcomes
        ],
    }
    return orjson.dumps(body, option=orjson.OPT_INDENT_2).decode()
