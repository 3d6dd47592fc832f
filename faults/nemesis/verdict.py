"""The nemesis' verdict: the oracle of faults/oracle.py over the whole history, plus what
only a schedule of faults can judge. Pure: the history, the faults as they happened and the
readiness times in, counts and problems out.

On top of the oracle's counts (lost = 0, duplicated = 0, reordered = 0, nothing received that was
never acknowledged unless a commit of that id had an unknown outcome):

- every Resync (and `missed`, 410, dead-letter `epoch`/`trimmed`) is *justified*: a fault that
  may destroy history (`Fault.destroys_history`) began before it and ended at most `GRACE`
  seconds before it;
- a durable consumer's item is never handed out again after an ack of it took effect, unless
  such a fault happened between the two;
- every publisher answered `/readyz` 200 within `READY_WITHIN` seconds after the last heal;
- every listener delivered the last acknowledged commit (it caught up);
- the PostgreSQL outbox: nothing of a transaction rolled back on purpose was ever delivered
  (`rolled_back`), and after the run the outbox is empty, has no dead row, every committed row
  was relayed and a publisher holds the relay lock (`outbox_problems`).

An outbox commit whose relay into the bucket spans a fault that may destroy history is of
unknown outcome as well (`relayed_in_doubt`): the relay's commit may have reached a master that
was then lost, its reply with it, and the relay commits the batch again under its key into the
history that survived, under a new cursor (docs/postgres.md), as a writer's retry does after an
unknown outcome.

A failure names the seed, the fault in progress and the first offending change with its trace:
every commit of its id, what that listener delivered of it, its Resyncs and bootstraps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from faults.nemesis.schedule import Fault
from faults.nemesis.system import Injected
from faults.oracle import History, Verdict, classify, strangers
from faults.records import Attempt, Delivered, ListenerLog, Outcome, epoch_of, position_of
from publisher.outbox.status import Status

GRACE = 30.0
"""Seconds after a history-destroying fault within which a Resync is still its consequence (a
paused publisher, a listener in backoff, a reader's long poll may learn of it that late)."""
READY_WITHIN = 30.0


@dataclass
class Judgement:
    """The nemesis' verdict of one run."""

    seed: int
    verdict: Verdict
    unjustified: dict[str, int] = field(default_factory=dict)
    redelivered: dict[str, int] = field(default_factory=dict)
    ready: Mapping[str, float | None] = field(default_factory=dict)
    behind: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rolled_back: dict[str, int] = field(default_factory=dict)
    """Per listener: deliveries (changes, bootstrapped objects) of rolled-back transactions."""
    trace: str = ""

    def problems(self) -> list[str]:
        found = list(self.verdict.problems())
        found += [f"{n}: unjustified resyncs={c}" for n, c in self.unjustified.items() if c]
        found += [f"{n}: redelivered after ack={c}" for n, c in self.redelivered.items() if c]
        found += [f"{n}: delivered rolled-back transactions={c}"
                  for n, c in self.rolled_back.items() if c]
        found += [f"{n}: not ready within {READY_WITHIN:.0f} s"
                  for n, t in self.ready.items() if t is None or t > READY_WITHIN]
        found += [f"{n}: not caught up" for n in self.behind]
        found += self.failures
        return found


def justified(time: float, done: Sequence[Injected], end: float) -> bool:
    """Whether a history-destroying fault began before `time` and ended within GRACE of it
    (`end`: when the run ended, for a fault never healed)."""
    return any(i.fault.destroys_history and i.started <= time
               and (i.ended or end) + GRACE >= time for i in done)


def judge(seed: int, history: History, done: Sequence[Injected], end: float, *,
          ready: Mapping[str, float | None], behind: Sequence[str] = (),
          failures: Sequence[str] = (), rolled_back: Collection[str] = ()) -> Judgement:
    """The verdict; `rolled_back`: the ids of transactions rolled back on purpose."""
    judgement = Judgement(seed, history.verdict(), ready=ready, behind=list(behind),
                          failures=list(failures))
    for name, log in history.listeners.items():
        judgement.rolled_back[name] = (
            sum(1 for c in log.changes if c.id in rolled_back)
            + sum(1 for b in log.bootstraps for id in b.states if id in rolled_back))
        judgement.unjustified[name] = sum(
            1 for r in log.resyncs if not justified(r.time, done, end))
        judgement.redelivered[name] = sum(
            1 for ack, again in log.redelivered_after_ack()
            if not any(i.fault.destroys_history and i.started <= again.time
                       and (i.ended or end) + GRACE >= ack.time for i in done))
    if judgement.problems():
        judgement.trace = first_offence(judgement, history, done)
    return judgement


def first_offence(judgement: Judgement, history: History, done: Sequence[Injected]) -> str:
    """The seed, the first offending change (lost, duplicated, reordered or never written) of
    the first listener that has one, the faults in progress then, and its trace."""
    acked = history.acked
    maybe = Counter(a.id for a in history.attempts if a.outcome is Outcome.UNKNOWN)
    start = min((i.started - i.fault.at for i in done), default=0.0)
    for name, log in history.listeners.items():
        tally = judgement.verdict.listeners[name]
        if not (tally.lost or tally.duplicated or tally.reordered or tally.unacknowledged):
            continue
        offence = _offence(log, acked, maybe)
        if offence is None:
            continue
        what, id, when = offence
        at = when - start
        held = [i.fault.describe() for i in done
                if i.started <= when <= (i.ended or when)]
        return "\n".join([
            f"seed {judgement.seed}: {name}: {what} at {at:.2f}s of the run",
            f"faults in progress: {held or 'none'}",
            *trace(history, log, id, start),
        ])
    if judgement.problems():
        return f"seed {judgement.seed}: {judgement.problems()[0]}"
    return ""


def _offence(log: ListenerLog, acked: Sequence[Attempt],
             maybe: Counter[str]) -> tuple[str, str, float] | None:
    """The first lost, duplicated, reordered or never acknowledged change of `log` (`maybe`:
    commits of unknown outcome by id, each of which may explain one never acknowledged
    cursor of its id)."""
    owed = [a for a in acked if a.stamp > log.after]
    lost = next((a for a in owed if classify(log, a) == "lost"), None)
    if lost is not None:
        return f"lost {lost.id} seq {lost.seq} cursor {lost.cursor}", lost.id, lost.time
    seen: set[tuple[str, str]] = set()
    newest: dict[str, str] = {}
    resyncs = [r.stamp for r in log.resyncs]
    for n, change in enumerate(log.changes):
        if resyncs and resyncs[0] < change.stamp:  # a Resync starts the order over
            resyncs = [r for r in resyncs if r > change.stamp]
            newest = {}
        epoch = epoch_of(change.cursor)
        again = (change.cursor, change.id) in seen
        back = change.cursor < newest.get(epoch, "")
        if (again or back) and not log.excused(change, log.changes[:n]):
            what = "duplicated" if again else f"reordered (after {newest[epoch]})"
            return f"{what} {change.id} {change.cursor}", change.id, change.time
        seen.add((change.cursor, change.id))
        newest[epoch] = max(change.cursor, newest.get(epoch, change.cursor))
    by_id: dict[str, set[str]] = {}
    for change in strangers(log, acked):
        by_id.setdefault(change.id, set()).add(position_of(change.cursor))
    stranger = next((c for c in strangers(log, acked)
                     if len(by_id[c.id]) > maybe[c.id]), None)
    if stranger is not None:
        return (f"received, never acknowledged: {stranger.id} {stranger.cursor}", stranger.id,
                stranger.time)
    return None


def trace(history: History, log: ListenerLog, id: str, start: float) -> list[str]:
    """Every commit of `id` and everything `log` delivered of it, with its Resyncs and
    bootstraps, in stamp order (times in seconds from the start of the run)."""
    rows: list[tuple[int, str]] = []
    for a in history.attempts:
        if a.id == id:
            outcome = a.cursor if a.outcome is Outcome.ACKNOWLEDGED else a.outcome.value
            rows.append((a.stamp, f"{a.time - start:8.2f}s commit {id} seq {a.seq}: {outcome}"))
    for c in log.changes:
        if c.id == id:
            rows.append((c.stamp, f"{c.time - start:8.2f}s {log.name} got {_delivered(c)}"))
    for r in log.resyncs:
        rows.append((r.stamp, f"{r.time - start:8.2f}s {log.name} Resync ({r.reason})"))
    for b in log.bootstraps:
        seq = b.states.get(id)
        rows.append((b.stamp, f"{b.time - start:8.2f}s {log.name} bootstrap: {id} seq {seq}"))
    return ["trace:", *(f"  {text}" for _, text in sorted(rows))]


def _delivered(c: Delivered) -> str:
    return f"{c.cursor}{' (coalesced)' if c.coalesced else ''}"


def recoveries(history: History, done: Sequence[Injected]) -> list[float]:
    """Per healed fault: seconds until every listener delivered a change again after it."""
    found = []
    for injected in done:
        if injected.ended is None:
            continue
        firsts = [log.first_delivery_after(injected.ended) for log in history.listeners.values()]
        if firsts and all(f is not None for f in firsts):
            found.append(max(f for f in firsts if f is not None) - injected.ended)
    return found


def relayed_in_doubt(spans: Sequence[tuple[str, int, float, float | None]],
                     done: Sequence[Injected], end: float) -> list[tuple[str, int]]:
    """The (id, seq) of the outbox commits whose relay may have been written twice: `spans`
    are (id, seq, COMMIT time, time its cursor was learnt or None), the relay's bucket commit
    lies between the two; those spanning a fault that may destroy history are in doubt."""
    return [(id, seq) for id, seq, committed, learnt in spans
            if any(i.fault.destroys_history and i.started <= (learnt or end)
                   and committed <= (i.ended or end) for i in done)]


def outbox_problems(status: Status | None, never_relayed: int, dead: Sequence[str]) -> list[str]:
    """What is wrong with the outbox after the run (`status`: read then, None when PostgreSQL
    did not answer; `never_relayed`: committed rows the relay never relayed; `dead`: the outbox
    writer's dead rows, described)."""
    if status is None:
        return ["outbox: PostgreSQL did not answer after the run"]
    found = [f"outbox: dead row {d}" for d in dead]
    if never_relayed:
        found.append(f"outbox: {never_relayed} committed rows never relayed")
    if status.backlog:
        found.append(f"outbox: backlog {status.backlog} after the run")
    if status.dead and not dead:
        found.append(f"outbox: {status.dead} dead rows")
    if status.relaying is None:
        found.append("outbox: no publisher holds the relay lock after the run")
    return found


def destroying(faults: Sequence[Fault]) -> int:
    return sum(1 for f in faults if f.destroys_history)


__all__ = ["GRACE", "READY_WITHIN", "Judgement", "destroying", "first_offence", "judge",
           "justified", "outbox_problems", "recoveries", "relayed_in_doubt", "trace"]
