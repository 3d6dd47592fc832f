"""docs/reliability.md from the rows of a run of the fault matrix (pure: text in, text out)."""

from __future__ import annotations

from collections.abc import Sequence

from tests.faults.harness import Row

HEADER = (
    "| scenario | changes committed | lost | duplicated | reordered | announced resyncs "
    "| time to recover | lost, announced | covered by a bootstrap | received, never acknowledged "
    "| errors | verdict |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
)

PROSE = """\
## How to read the table

Every scenario runs real `redis-server`s and real `changefeed serve` processes on free ports,
a writer that records every cursor `commit` returned, and listeners (`listener.Listener`, or bare
websockets for the herd) that record every event they deliver. The oracle
(`tests/faults/oracle.py`) then classifies, per listener, every change whose commit was
acknowledged:

- **lost**: never delivered as a `Change`, not reflected in a bootstrap, and the listener was
  never told: the failure the suite exists to catch. Must be 0.
- **lost, announced**: never delivered and gone from the store, but the listener received a
  `Resync` after the commit was acknowledged, so it threw its view away and bootstrapped again.
- **covered by a bootstrap**: not delivered as a `Change`, but a completed bootstrap of that
  listener delivered the object at that state or a later one (the rule: the bootstrap's records
  include the changed id with a `seq` at least the change's; a bootstrap that was started over is
  ignored).
- **duplicated**, **reordered**: a change delivered twice to one listener, or after a change of
  a later cursor of the same epoch since the last `Resync`. docs/protocol.md and
  docs/listener.md promise each change once, in order, across reconnects: both must be 0.
- **received, never acknowledged**: a change whose cursor the writer was never given; an error
  unless a commit of that id ended with an unknown outcome (a lost reply), which may be written.
- **errors**: refusals and closes a listener should not have met (the herd counts its 1013s).
- **announced resyncs**: `Resync` events delivered, over all listeners.
- **time to recover**: seconds from the end of the fault (SIGCONT, the restart being ready, the
  proxy passing bytes again; for the herd, the start of the herd) until every listener had
  delivered a change or completed a bootstrap again; `—` when one never did.

Counts are summed over a scenario's listeners (an acknowledged change lost by two listeners
counts twice).

## Which failures can lose acknowledged changes

A change is acknowledged when `commit` returns its cursor: Redis has run the commit script. It
can still disappear, or never reach a listener, when:

1. **Redis restarts without persistence** (no AOF, no RDB). The bucket comes back empty. The
   first commit or the tail's next read creates a new epoch; every publisher that notices closes
   its listeners with **4009** `bucket recreated: bootstrap again`; the `Listener` reconnects
   with its old cursor, the publisher answers **`resumed: false`** (a foreign epoch), and the
   listener yields **`Resync`** and bootstraps. A pull consumer gets **`missed: true`** from the
   `events` long poll (`ItemsMissed`). Measured: "redis SIGKILL, no persistence" (when the
   listeners had delivered every acknowledged change before the kill, nothing shows under
   "lost, announced": the changes are gone from the store all the same, and the bootstrap
   after the `Resync` hands the listener what is left).
2. **Redis loses its last writes but keeps the bucket**: restored from an older RDB snapshot,
   an AOF with `appendfsync everysec` (the embedded Redis's setting) after a power loss or
   kernel crash (up to a second of commits), or **a failover to a replica that lagged**. The
   epoch survives and the head goes backwards. Measured: "redis restored from an older RDB". A
   failover to a lagging replica has the same shape but is not exercised here (the suite runs no
   replicas).
3. **The log is trimmed past a position that is still needed**: a listener that was away
   longer than `maxAge` (or past `maxItems`) resumes with a cursor older than the trimmed
   horizon and gets **`resumed: false`** → **`Resync`** (or **4008** if it happens during its
   replay, then `resumed: false`); a pull consumer gets **`missed: true`**. A *publisher* whose
   tail is behind the trim (paused, or overloaded, with another publisher trimming): measured in
   "tail behind trim".

Redis with `appendonly yes` and `appendfsync always` loses nothing on a crash of the Redis
process or of the host ("redis SIGKILL, AOF fsync always"). A paused Redis, a killed
publisher, a network that drops, delays or resets the listener's connection lose nothing: the
listener resumes after the last change it delivered.

A commit whose reply is lost (a timeout or a reset after the request left) raised
`BucketUnavailable`, "nothing was written", although the change may have been written.
"""

TODO = """\
## TODO: behaviour after the fixes of issue 11

<!-- TODO(issue 11): to be written once the fixes are merged; the table above is from real
runs of the code at the commit named above, before them. -->

- **Rollback (older snapshot, lagging replica)**: TODO — how the publisher detects that the
  head went backwards, and what the listener sees (expected: a new epoch, 4009 → `Resync`).
- **Tail behind trim**: TODO — how a publisher whose tail fell behind the trimmed horizon tells
  its listeners (expected: 4009 / `resumed: false` → `Resync`).
- **Commit outcome unknown**: TODO — the exception a commit raises when its reply was lost
  (the writer of this suite records such commits as "maybe").
- **Herd of resumes**: TODO — the connection limit behind the false 1013s.
"""


def cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def table(rows: Sequence[Row]) -> str:
    lines = []
    for row in rows:
        t = row.verdict.total
        verdict = "ok" if not row.verdict.problems() else "**FAIL**"
        lines.append(
            f"| {row.scenario} | {row.verdict.committed} | {t.lost} | {t.duplicated} "
            f"| {t.reordered} | {t.resyncs} | {cell(row.recover)} | {t.lost_announced} "
            f"| {t.covered} | {t.unacknowledged} | {t.errors} | {verdict} |"
        )
    return HEADER + "\n".join(lines) + "\n"


def notes(rows: Sequence[Row]) -> str:
    found = [f"- {row.scenario}: {'; '.join(row.notes)}" for row in rows if row.notes]
    return "Notes from the run (close codes the listeners met, laggards):\n\n" + "\n".join(
        found) + "\n" if found else ""


def render(rows: Sequence[Row], *, command: str, machine: str, date: str, commit: str,
           seconds: float) -> str:
    return (
        "# Reliability: the fault-injection matrix\n\n"
        "<!-- written by `python -m tests.faults`; edit tests/faults/report.py, not this file"
        " (except the TODO section) -->\n\n"
        f"Produced by `{command}` on {machine}, {date}, at commit `{commit}`, in "
        f"{seconds:.0f} s. The quick variants of the same scenarios run in the test suite "
        "(`pytest -m faults`, tests/faults/test_quick.py).\n\n"
        + table(rows) + "\n" + notes(rows) + "\n" + PROSE + "\n" + TODO
    )
