"""docs/reliability.md from the rows of a run of the fault matrix (pure: text in, text out)."""

from __future__ import annotations

from collections.abc import Sequence

from faults.harness import Row

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
(`faults/oracle.py`) then classifies, per listener, every change whose commit was
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
   epoch survives and the head goes backwards. Two witnesses notice it: every publisher
   remembers the newest position its tail read, and every `ChangeBucket` client remembers the
   newest position it was acknowledged and sends it with its next commit. A head behind either
   is a new history: the bucket gets a **new epoch** (once, whoever sees it first), logged at
   error (`bucket rolled back`), and every publisher closes its listeners with **4009**
   `bucket rolled back: bootstrap again` (or `bucket recreated: bootstrap again` when another
   publisher or a writer renewed the epoch first); `since` then gets **`resumed: false`** and
   the `Listener` yields **`Resync`**. The changes the rollback removed are gone from the store
   too, so the bootstrap hands the listener the store as it now is ("lost, announced").
   Measured: "redis restored from an older RDB" (the publisher is paused across the rollback,
   so only the writer's witness can see it). A failover to a replica that lagged is the same
   case: measured in "redis sentinel failover, replica lagging" (a master, a replica whose link
   is blackholed, three sentinels). So is a **split brain**: a master killed and restarted
   after the sentinels promoted its replica is a master of its own for about 8 s, until a
   sentinel demotes it and its resync throws away what it acknowledged meanwhile. Its writers'
   commits are then missing from the surviving master: commit.lua looks up each writer's
   witness (a change it was acknowledged, by id and a fingerprint) in the Redis that runs its
   next commit, and one it lacks starts a new epoch, whatever epoch either side had (the two
   sides may share one) and wherever the heads are (found by the nemesis, below). Not seen: a
   rollback of commits that no running publisher read and whose writer has gone (a new client, a
   `changefeed publish` process, has no witness). Such a writer should ask for the replicas'
   confirmation (`commit(..., replicas=1)`, `changefeed publish --replicas 1`): acknowledged
   then means on the replica too, and a commit it did not confirm fails with
   `ReplicationTimeout` (written on the master only; commit again under the same key).
3. **The log is trimmed past a position that is still needed**: a listener that was away longer
   than `maxAge` (or past `maxItems`) resumes with a cursor older than the trimmed horizon and
   gets **`resumed: false`** → **`Resync`**; a pull consumer gets **`missed: true`**
   (`ItemsMissed`). A *publisher* whose tail falls behind the trim (paused, or overloaded, with
   another publisher trimming) sees it in the same read that brings the entries
   (`{name}:trimmed` past its position), logs `tail fell behind the trim horizon: items trimmed
   before they were sent` at warning with the number of items lost, counts it in
   `/changefeeds/stats` (`tail.trimGaps`, `tail.itemsLost`, `closed.trimGap`), and closes every
   listener it had not yet sent past the horizon with **4009** `items trimmed before they were
   sent: bootstrap again`; their `since` is older than the horizon, so **`resumed: false`** →
   **`Resync`**. A resume replay that is trimmed under it is closed the same way. Measured:
   "tail behind trim".

Redis with `appendonly yes` and `appendfsync always` loses nothing on a crash of the Redis
process or of the host ("redis SIGKILL, AOF fsync always"). A paused Redis, a killed
publisher, a network that drops, delays or resets the listener's connection lose nothing: the
listener resumes after the last change it delivered.

## What a writer is told

- `commit` returned a cursor: the change is in Redis (and, with AOF `always`, on disk).
- **`BucketUnavailable`**: nothing was sent (Redis unreachable before the request left):
  nothing was written; retrying is safe.
- **`CommitOutcomeUnknown`** (a `BucketUnavailable`): the request was sent and no answer came
  (a timeout, a reset): the change may have been written and delivered ("commit reply lost":
  the suite records such commits as "maybe"). Retry with the same **idempotency key**
  (`commit(..., key=...)`, `changefeed publish --key`): a retry of a commit that got in returns
  its original cursor and writes nothing; one that did not writes it once.
- **`BucketBusy`** (a `BucketUnavailable`): the publisher's Redis pool stayed busy for
  `bucket.poolTimeout`: overload, nothing was sent. Listeners see **4029** (websocket) or
  **503 `Overloaded`** with `Retry-After`, never the 1013 / 503 `BucketUnavailable` of a real
  outage ("herd of 500 resumes": 500 resumes at once on one publisher, none refused).

## The outbox scenarios

The rows named `outbox: ...` run the PostgreSQL outbox ([postgres.md](postgres.md)): the writer
is a service committing a `vms` row and `changefeed.put` in one PostgreSQL transaction
(tests/publisher/outbox/rig.py), publisher processes relay the outbox, and a change is
*acknowledged* when its transaction committed; its cursor is the one the relay recorded
(`changefeed.outbox_relayed`), and a committed row never relayed counts as lost. A COMMIT cut
off by the fault is an unknown outcome ("maybe"). "relaying publisher SIGKILL": two publishers
share the outbox, the one holding the relay lock is killed (the notes give the takeover time).
"PostgreSQL SIGKILL": every backend killed, crash recovery at the restart. "Redis SIGKILL, AOF":
the service commits on while the bucket is down (the notes count its failed transactions: 0).
"Redis restarted empty": the relay re-seeds the store from the snapshot query; every listener
gets a `Resync` (the writer pauses across the kill). "LISTEN cut": the relay's LISTEN session is
terminated every 0.3 s: the poll relays. The relay killed between the bucket's commit and the
rows' removal is tested in tests/publisher/outbox/test_relay.py (the bucket's key absorbs the
re-sent batch).
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
        "<!-- written by `python -m faults`; edit faults/report.py, not this file"
        " -->\n\n"
        f"Produced by `{command}` on {machine}, {date}, at commit `{commit}`, in "
        f"{seconds:.0f} s. The quick variants of the same scenarios run in the test suite "
        "(`pytest -m faults`, tests/faults/test_quick.py).\n\n"
        + table(rows) + "\n" + notes(rows) + "\n" + PROSE
    )
