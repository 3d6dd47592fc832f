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
    if report.probes:
        lines[1:1] = [probes(report)]
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


def probes(report: Report) -> str:
    """What the checks wrote into the publisher's bucket, named."""
    ids = report.probes
    named = ids[0] if len(ids) == 1 else f"{ids[0]} .. {ids[-1]}"
    return (f"wrote {len(ids)} probe change(s) of {report.resource} into the live bucket: "
            f"{named} (listeners of {report.resource} receive them)")


def as_json(report: Report) -> str:
    body: dict[str, Any] = {
        "url": report.url,
        "resource": report.resource,
        "passed": report.passed,
        "counts": {s.name.lower(): report.count(s) for s in Status},
        "probes": list(report.probes),
        "checks": [
            {"name": o.name, "group": o.group, "status": o.status.name.lower(),
             "detail": o.detail, "seconds": round(o.seconds, 3)}
            for o in report.outcomes
        ],
    }
    return orjson.dumps(body, option=orjson.OPT_INDENT_2).decode()
