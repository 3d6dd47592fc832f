"""The nemesis' fault schedule: pure, seeded, printed before the run so a seed replays exactly.

A schedule is a list of `Fault`s, each a kind, a target and a window of the run (seconds from
its start: `at`, held `hold` seconds). Faults on one target never overlap (a publisher cannot be
killed twice); faults on different targets do, by design: that is where the single-fault suite
(faults/scenarios.py) cannot look.

The kinds are `KINDS`; `destroys_history` says which may destroy acknowledged history (a
Resync, `missed`, a 410 or a dead-letter record of reason `epoch` is justified only by one of
those). No wall-clock faults: every fault is a signal, a file, a Sentinel command or a proxy.

The PostgreSQL outbox (issue 23, docs/postgres.md) has kinds of its own: the relaying
publisher killed or paused (`relay_kill`, `relay_stop` on target `relay`: whichever publisher
holds the relay lock when the fault begins), the outbox's PostgreSQL killed (crash recovery) or
paused (`postgres_kill`, `postgres_stop` on `postgres`), and the relays cut from it
(`relay_partition` on `postgres-link`). None may destroy Redis history: the rows wait in
PostgreSQL, and a Resync is never their consequence. The oracle needs no change for them: the
outbox writer (faults/nemesis/writers.py) is one more writer whose acknowledged commits
(transactions committed in PostgreSQL) must reach every listener.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SENTINEL_DOWN_AFTER = 1.0
"""Seconds without an answer before the sentinels call the master down (and fail over)."""
REST = 2.0
"""Seconds a target rests between the heal of one fault and the next fault on it (a publisher
or Redis starting again takes about that long on a busy machine)."""


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of fault: `name`, the targets it may hit, its weight in the draw and the range
    of its hold (seconds)."""

    name: str
    targets: tuple[str, ...]
    weight: int
    hold: tuple[float, float]
    destroys: bool = False
    """Always may destroy acknowledged history (else see `Fault.destroys_history`)."""


PUBLISHERS = ("publisher-0", "publisher-1", "publisher-2")

KINDS: tuple[Kind, ...] = (
    Kind("publisher_kill", PUBLISHERS, 4, (0.5, 4.0)),
    Kind("publisher_stop", PUBLISHERS, 3, (0.5, 4.0)),
    Kind("redis_kill", ("redis",), 2, (0.3, 3.0), destroys=True),
    Kind("redis_stop", ("redis",), 2, (0.3, 3.0)),
    Kind("sentinel_failover", ("redis",), 1, (0.0, 0.0), destroys=True),
    Kind("redis_restart_empty", ("redis",), 1, (0.2, 0.5), destroys=True),
    Kind("redis_restart_snapshot", ("redis",), 1, (1.0, 3.0), destroys=True),
    Kind("link_blackhole", ("link",), 2, (1.0, 4.0)),
    Kind("link_drip", ("link",), 2, (1.0, 4.0)),
    Kind("link_cut", ("link",), 2, (0.5, 3.0)),
    Kind("partition", ("redis-link-2",), 2, (1.0, 4.0)),
    Kind("relay_kill", ("relay",), 1, (0.5, 3.0)),
    Kind("relay_stop", ("relay",), 1, (0.5, 3.0)),
    Kind("postgres_kill", ("postgres",), 1, (0.3, 2.0)),
    Kind("postgres_stop", ("postgres",), 1, (0.5, 3.0)),
    Kind("relay_partition", ("postgres-link",), 1, (1.0, 3.0)),
)
"""Every kind the nemesis draws from. A failover through Sentinel happens on `redis_kill` and
on `redis_stop` held past the sentinels' down-after, as well as on `sentinel_failover` (the
`SENTINEL FAILOVER` command): replication is asynchronous, so each may lose the newest
acknowledged commits (a rollback, which the publishers announce). A `redis_kill` held 1.5 s or
more first makes the replicas lag (`faults.nemesis.system.LAGGING_HOLD`): the promoted replica
surely lacks acknowledged commits, some of them retried and acknowledged again by it. The
outbox kinds weigh 1 each (5 of 27): Redis and publisher faults still dominate."""

BY_NAME = {kind.name: kind for kind in KINDS}

TEST_SEED = 5203
"""The seed of the test suite's 60-second run (tests/faults/test_nemesis.py): its schedule draws
every kind (a test checks it does). With the outbox's five kinds of weight 1, two seeds of the
first 20,000 do: 5079 and 5203."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault of the schedule: `kind` on `target` from `at` for `hold` seconds."""

    number: int
    kind: str
    target: str
    at: float
    hold: float

    @property
    def end(self) -> float:
        return self.at + self.hold

    @property
    def destroys_history(self) -> bool:
        """Whether this fault may destroy acknowledged history: Redis restarted empty or from
        a snapshot, or a failover to a replica that may lag (a kill, a forced failover, a pause
        longer than the sentinels' patience)."""
        if BY_NAME[self.kind].destroys:
            return True
        return self.kind == "redis_stop" and self.hold >= SENTINEL_DOWN_AFTER * 0.8

    def describe(self) -> str:
        return f"#{self.number} {self.kind} {self.target} at {self.at:.2f}s for {self.hold:.2f}s"


def make_schedule(seed: int, duration: float, *, warmup: float = 3.0, quiet: float = 4.0,
                  mean_gap: float = 2.5, kinds: tuple[Kind, ...] = KINDS) -> list[Fault]:
    """The faults of a run of `duration` seconds, drawn from `random.Random(seed)`: starts
    `mean_gap` seconds apart on average (exponential gaps, so faults bunch and overlap), none in
    the first `warmup` seconds, every one healed `quiet` seconds before the end."""
    rng = random.Random(seed)
    busy: dict[str, float] = {}
    weights = [kind.weight for kind in kinds]
    faults: list[Fault] = []
    t = warmup
    while True:
        t += rng.expovariate(1 / mean_gap)
        kind = rng.choices(kinds, weights)[0]
        hold = round(rng.uniform(*kind.hold), 2)
        target = rng.choice(kind.targets)
        if t + hold > duration - quiet:
            break
        if busy.get(target, 0.0) > t:
            continue  # that target is still under a fault: draw again later
        faults.append(Fault(len(faults) + 1, kind.name, target, round(t, 2), hold))
        busy[target] = t + hold + REST
    return faults


def overlapping(faults: list[Fault]) -> int:
    """How many faults began while another was still held."""
    return sum(1 for f in faults if any(g.at <= f.at < g.end for g in faults if g is not f))


def active(faults: list[Fault], at: float) -> list[Fault]:
    """The faults held at `at` (seconds from the start)."""
    return [f for f in faults if f.at <= at <= f.end]


def render(seed: int, duration: float, faults: list[Fault]) -> str:
    lines = [f"nemesis schedule: seed {seed}, {duration:.0f} s, {len(faults)} faults "
             f"({overlapping(faults)} overlapping)"]
    lines += ["  " + f.describe() + ("  [may destroy history]" if f.destroys_history else "")
              for f in faults]
    return "\n".join(lines)


__all__ = ["BY_NAME", "KINDS", "TEST_SEED", "Fault", "Kind", "active", "make_schedule",
           "overlapping", "render"]
