"""A run's history as evidence: every commit attempt, every fault as it happened and everything
each listener saw, one JSON object per line, in time order (`history.jsonl` in the run's
directory, kept with `--keep`; pytest keeps its last three temporary directories). A failing
seed's first offending change can be followed through it, and a run whose history is not on disk
has not passed (the standard of etcd's robustness tests and Jepsen's reports).

    {"t": 12.503, "kind": "commit", "id": "api-7", "seq": 3, "outcome": "acknowledged", ...}
    {"t": 12.51, "kind": "delivered", "listener": "ws-0-1", "id": "api-7", "cursor": ...}
    {"t": 13.75, "kind": "fault", "number": 9, "fault": "redis_kill", "target": "redis", ...}
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from faults.nemesis.system import Injected
from faults.oracle import History

FILE = "history.jsonl"


def records(history: History, done: Sequence[Injected], start: float) -> Iterator[dict[str, Any]]:
    """The history's records, each with `t` (seconds since `start`), in no particular order."""
    for a in history.attempts:
        yield {"t": a.time - start, "kind": "commit", "id": a.id, "seq": a.seq,
               "outcome": a.outcome.name.lower(), "cursor": a.cursor, "stamp": a.stamp,
               "since": a.since, "batch": a.batch}
    for injected in done:
        fault = injected.fault
        yield {"t": injected.started - start, "kind": "fault", "number": fault.number,
               "fault": fault.kind, "target": fault.target, "hit": injected.hit,
               "healed": None if injected.ended is None else injected.ended - start,
               "notes": injected.notes}
    for name, log in history.listeners.items():
        for d in log.changes:
            yield {"t": d.time - start, "kind": "delivered", "listener": name, "id": d.id,
                   "cursor": d.cursor, "stamp": d.stamp, "coalesced": d.coalesced}
        for k in log.acks:
            yield {"t": k.time - start, "kind": "acked", "listener": name, "id": k.id,
                   "cursor": k.cursor, "stamp": k.stamp}
        for r in log.resyncs:
            yield {"t": r.time - start, "kind": "resync", "listener": name, "reason": r.reason,
                   "stamp": r.stamp}
        for kind, marks in (("resumed", log.resumes), ("told epoch", log.told)):
            for m in marks:
                yield {"t": m.time - start, "kind": kind, "listener": name, "cursor": m.cursor,
                       "stamp": m.stamp}
        for b in log.bootstraps:
            yield {"t": b.time - start, "kind": "bootstrap", "listener": name,
                   "objects": len(b.states), "stamp": b.stamp}
        for error in log.errors:
            yield {"t": None, "kind": "error", "listener": name, "error": error}


def write(directory: Path, history: History, done: Sequence[Injected], start: float) -> Path:
    """Write the history to `directory`/history.jsonl, in time order (errors, untimed, last)."""
    path = directory / FILE
    ordered = sorted(records(history, done, start),
                     key=lambda r: (r["t"] is None, r["t"] or 0.0, r.get("stamp") or 0))
    with path.open("w") as out:
        for record in ordered:
            out.write(json.dumps(record, separators=(",", ":")) + "\n")
    return path


__all__ = ["FILE", "records", "write"]
