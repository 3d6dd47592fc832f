"""The "nemesis" section of docs/reliability.md, from runs (pure: results in, Markdown out).

The section sits between `BEGIN` and `END` markers: `splice` replaces it in the file and keeps
everything else (the fault matrix that `python -m faults` writes keeps it too).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Sequence

from faults.nemesis.run import Result
from faults.nemesis.schedule import TEST_SEED as SEED
from faults.nemesis.schedule import overlapping
from faults.nemesis.verdict import GRACE, READY_WITHIN

BEGIN = "<!-- nemesis: written by `python -m faults.nemesis --docs`; begin -->"
END = "<!-- nemesis: end -->"

PROSE = f"""\
How to read it. Each run starts the system (three `changefeed serve` processes, a Redis master
with a replica and three sentinels, a PostgreSQL with the outbox that two of the publishers
relay, four writers, eight listeners of every kind: websocket
`Listener`s with and without `coalesce`, SSE, the `events` pull consumer, two instances of a
durable consumer, the ZeroEventHub feed reader) and injects the schedule its seed draws, printed
first so a seed replays it. The oracle (faults/oracle.py, faults/nemesis/verdict.py)
then judges the whole history, per listener: every acknowledged change received, covered by a
bootstrap, or lost *and announced* (a Resync after it was first sent: a commit retried under its
key may have been written by its first try; for readers without a bootstrap: `resync`,
`missed`, 410, a dead-letter record of reason `epoch`); nothing duplicated or reordered (a durable
consumer may be handed an item again until its ack takes effect, never after; an id received
coalesced may come again); nothing received that no writer was acknowledged, except after a
commit whose outcome was unknown. Every Resync must follow a fault that may destroy history
(Redis killed, restarted empty or from an older snapshot, paused past the sentinels' patience, a
forced failover) by at most {GRACE:.0f} s, and every publisher must answer `/readyz` 200 and
Redis have one master again and a publisher hold the outbox's relay lock within
{READY_WITHIN:.0f} s of the last heal. *Recovery* is the time
from a fault's heal until every listener delivered something again. The soak adds churn
(a listener joining every 0.5 s for 1 to 8 s, a third resuming, 1% slow, publisher 1 refusing
past 12 listeners) and samples publisher RSS, open fds, asyncio tasks and the Redis master's
memory every 3 s; a least-squares slope over the second half of a phase above its limit
(faults/nemesis/soak.py `LIMITS`: 1 MiB or 1.5% of RSS a minute, 6 fds, 12 tasks) is a
leak. The soak bounds what is bounded by design to about 30 s of commits (`maxAge` 30, a window
and a delivery trace of 500 items), so it is full before the judged half: with the trace's
default of 10,000 items, publishers gained 0.5 MiB a minute for the ten minutes it took to fill
(a 600-second soak without faults), which is no leak but would hide one.

`--busy N` keeps N cores busy for the whole run (faults/busy.py: a spinning process on each), so
that the system under test waits for a core and the windows between its reads widen; its soaks
go to a part of their own above, beside the quiet machine's.

The faults (faults/nemesis/schedule.py `KINDS`): SIGKILL and SIGSTOP of a publisher
(killed ones start again on their port), SIGKILL and SIGSTOP of the Redis master (whichever node
the sentinels name then; a killed node comes back with its append-only file), `SENTINEL
FAILOVER`, the master restarted empty or from an RDB snapshot taken when the fault began, the
listeners' link to publisher 0 blackholed, dripping 2000 B/s or cut (a TCP proxy), and a
partition between publisher 2 and Redis. Publisher 2 runs in a network namespace of its own
(changefeed_testing/netns.py, where the run may make one: as root, as CI runs) and reaches Redis
through a proxy that always leads to the current master, over a veth pair that the partition
takes down: the kernel drops its bytes (established connections stall and time out, new ones
time out or find no route), while its listeners, readiness checks and PostgreSQL reach it over a
second pair. Only publisher 2: the sentinels hand out the master's loopback address, which inside
a namespace is the namespace's own, so a publisher that follows the sentinels would need every
node and sentinel to announce veth addresses. Without root the partition is the proxy's
blackhole. No fault touches a clock. The outbox (docs/postgres.md) has
five kinds of its own, none of which may destroy Redis history (so none justifies a Resync):
SIGKILL and SIGSTOP of whichever publisher holds the relay lock when the fault begins (read from
the outbox's status, `pg_locks`; a killed one starts again), SIGKILL of PostgreSQL's
postmaster (its backends exit when they see it gone; crash recovery at the restart), SIGSTOP of
every process of its cluster, and a partition between the relays and PostgreSQL (a blackholing
proxy both relaying publishers go through; the writer connects directly and commits on, its rows
wait).

The writers: one commit at a time (`ChangeBucket.commit`, 10 a second), batches of 1 to 5
(`commit_many`, 2 a second), and `changefeed publish --replicas 1` every 3 s, each under an
idempotency key and retried with it until acknowledged. The command-line writer asks for its
replica's confirmation because a one-shot process has no witness: without it, a commit it was
acknowledged just before a failover could be lost unannounced (the case "Not seen" above).
The outbox writer is a service keeping its state in PostgreSQL (5 transactions a second): a row
of its own table and `changefeed.put(...)` in one transaction, *acknowledged when its COMMIT
answers* (its place in the history is that moment); its cursor is learnt afterwards from the
outbox's record (`outbox.cursor`). The oracle judges its commits as every other: each reaches
every listener once, or is lost and announced. A COMMIT without an answer (PostgreSQL killed or
paused under it) is of unknown outcome; the retry looks for the row in the writer's table, whose
key (writer, seq) keeps it from committing twice. A commit whose relay into the bucket spans a
fault that may destroy history is of unknown outcome too: the relay's reply may have been lost
with a master whose write did not survive, and the relay sends the batch again under its key into
the history that did, under a new cursor. One transaction in ten, on ids of its own, is rolled
back on purpose: nothing of it may ever be delivered or bootstrapped. After the run the outbox
must be empty, with no dead row, every committed row relayed, a publisher relaying. No snapshot
query is configured (the resource is shared with the writers that commit to the bucket directly:
a re-seed from the outbox writer's table would delete their ids); the re-seed has its own
scenario in the fault matrix.

With `--spark` (opt-in: a Spark driver costs a core at its start and a moment per job, which
the suite's 60-second run cannot spare on two cores), two Spark writers run beside them
(faults/nemesis/spark_writer.py), both with `replicas=1`, as a Spark task is a one-shot
client without a witness. `spark`: a batch job per change every 2 s, one row through
`format("changefeed")` with `txnAppId` and `txnVersion` (a failed job runs again under the same
version, which publishes nothing twice); its cursor comes from the txn record. `spark-stream`: a
Structured Streaming query over a directory of JSON files, a file per change every 2 s and a
micro-batch per file (`maxFilesPerTrigger=1`), written with `writeStream.format("changefeed")`.
A micro-batch that fails ends the query, as Spark does; the writer starts it again from its
checkpoint, which runs the micro-batch again under its batch id (the sink's chunk keys publish
it once); the change is acknowledged when the query's ledger records its micro-batch, whose
first cursor is the change's. Its failure path has a test of its own on the suite's
SparkSession (tests/publisher/spark/test_stream.py,
`test_the_nemesis_stream_writer_publishes_once_across_a_failed_micro_batch`). Runs with them at
`bace333`, `--seed 5203 --seed 1 --duration 60 --spark` and `--seed 7 --duration 90 --spark`:
ok, nothing lost, duplicated or reordered. Their commits acknowledged and of unknown outcome
(batch, stream): seed 5203 2/4 and 2/6, seed 1 10/4 and 11/1, seed 7 2/10 and 2/10 (a fault
every 3 s, after which the replica often could not confirm within `replicasTimeout`, 2 s).

Bugs the nemesis found, each fixed at its cause with a regression test of its own:

- **A split brain's acknowledged commits were lost silently** (seed 1, 30 s: a forced failover,
  then the new master SIGKILLed and restarted before the sentinels had promoted the replica back;
  for about 8 s two masters took writes). The writers' witness is of an epoch the surviving
  master never held, so comparing heads could not see the loss, and no publisher read those
  commits. commit.lua then started a new epoch for a witness of an epoch the history did not
  descend from (since replaced by the lookup of the witnessed change itself, below), unless that
  witness is older than the current epoch's beginning (`{{name}}:epoch:at`: a bucket created
  again after Redis came back empty announced its loss by the epoch change already): every
  publisher closes its listeners with 4009, the loss is announced.
  tests/publisher/bucket/log/test_commits.py
  `test_a_commit_with_a_witness_of_a_history_this_bucket_never_held_starts_a_new_epoch`.
- **Kept connections stayed on a master of a split brain** (seed 12, 60 s: the feed reader,
  which moves between publisher 2, following the sentinels through its proxy, and publisher 0,
  was handed 35 items twice and 7 out of order; the path inferred from the run is publisher 0's
  kept tail read staying on the old master while it was a master of its own, and writers' kept
  connections committing there). redis-py asks the sentinels only when it opens a connection,
  and closes only idle ones when the master moved. `SentinelPool` now asks every second while
  in use and closes every connection, in use too, once the sentinels name another master; the
  seed's next three runs were clean.
  tests/publisher/bucket/redis/test_sentinel_pool.py
  `test_a_kept_connection_leaves_a_master_the_sentinels_replaced`.
- **... and a connection in use still stayed there** (CI, seed 12, 60 s: the pull reader got
  713 items twice; one publisher answered `events` from the old master and the new one by turns
  for ten seconds, two epochs). redis-py's own look at the sentinels, made by every new
  connection, records the new master before the pool's look does, so the pool saw no change.
  Now every look, the pool's and each new connection's, closes every connection that leads to
  another node than the master the sentinels name.
  tests/publisher/bucket/redis/test_sentinel_pool.py
  `test_a_new_connection_that_finds_a_new_master_closes_those_in_use`.
- **A tail ended silently and its publisher stayed ready** (seed 5079, 60 s: a connection
  closed under its handshake by the look above raised uvloop's `RuntimeError`, which no handler
  expected; the tail task ended, `/readyz` went on answering 200, and the publisher's listeners
  were sent nothing more). The tail now takes any error that is not Redis's as a fault of its
  own (logged with its traceback, counted in `changefeed_tail_unexpected_errors`, read again
  after a backoff), and the Sentinel pool reports that error as a lost connection.
  tests/publisher/delivery/test_tail.py `test_an_unexpected_error_of_a_read_does_not_end_the_tail`.
- **A durable consumer lost with Redis's state was made again without a word** (CI, seed
  5203, 60 s: Redis restored from a snapshot that did not hold the consumer; an instance's
  `ensure` created it anew from `start`, and the commit acknowledged just before the restore was
  never handed out, unannounced). The consumer's info now carries its `incarnation`, and a
  `DurableConsumer` that meets another incarnation than the one it used raises
  `ConsumerRecreated` once, at its next fetch. tests/listener/test_durable.py
  `test_an_instance_that_meets_its_consumer_created_again_is_told_once`.
- **The SSE reader of the nemesis resumed from where a failed stream began** (the 30-minute
  soak: a stream of 30 s ended by a publisher's SIGKILL; the reader sent the cursor it had at
  the stream's start, `maxAge` 30 had trimmed it, and the Resync came 32 s after the last
  history-destroying fault). A bug of the reader, not the product: it keeps Last-Event-ID as
  each event arrives. tests/faults/test_nemesis_readers.py.
- **A split brain whose sides shared the epoch lost acknowledged commits silently** (seed 5079,
  60 s, with the outbox: the relaying publisher saw a rollback and renewed the epoch on the master
  that won, while the other, a master of its own until demoted, went on acknowledging the API
  writer's commits in the old epoch; every listener lost one to three of them). The writer's
  next witness was of an epoch the winner descends from, so it was taken for one of the winner's
  own. A first fix recorded the epoch each renewal left and when; the seed still lost 2 changes:
  a client kept one witness, the newest position it was acknowledged, and its writers (the API
  and batch writers share one client, over two connections) were acknowledged by both sides by
  turns, so the newest was the winner's own. A witness is now a change, not a position: its id,
  partition and a fingerprint of its resource id, looked up (`XRANGE id id`) in the Redis that
  runs the next commit, one per connection with acknowledgements not checked since; one the
  Redis lacks starts a new epoch, whatever the epochs and heads (`{{name}}:epochs` and
  `{{name}}:epoch:from` are gone). tests/publisher/bucket/log/test_commits.py
  `test_a_witness_the_winner_lacks_starts_a_new_epoch_whatever_its_epoch_and_head` and
  `test_a_client_acknowledged_by_both_sides_at_once_keeps_a_witness_of_each` (both fail before).
- **A publisher whose tail had not read a new epoch registered listeners in the old one** (the
  30-minute soak, seed 12, at 1529 s: Redis restarted empty while publisher 2 was cut off from it
  by the kernel's partition; when the link came back its tail's late read still held the old
  history, and `ws-2-0`, registering there, was told to bootstrap, bootstrapped the new history,
  then was sent an old change it already had, from the tail's head behind its own cursor: a
  duplicate). A publisher now registers nobody while Redis holds an epoch its tail has not read:
  1013 `change bucket began a new epoch that this publisher has not read yet, try again later`
  (SSE: 503 `EpochNotRead`). tests/publisher/delivery/test_resume.py
  `test_no_registration_while_redis_holds_an_epoch_the_tail_has_not_read` (fails before).
- **A connection closed for leading to the old master went back to it** (the 30-minute soak
  above, seed 12, at 1027.9 to 1028.5 s: the `events` pull reader got one change twice across
  its Resyncs). Redis was SIGSTOPped past the sentinels' patience and the replica promoted; the
  pool closed its connections to the old master, those in use too. But redis-py sends a command
  again on the same connection object, and `send_packed_command` opens a closed connection to
  the address it had, not through the sentinels. The paused master took the connection in the
  kernel and answered once SIGCONTed, a master of its own with the old epoch until a sentinel
  demoted it 9.5 s later. For about a second publishers read the two epochs by turns, and the
  reader restarted from the old side's newest cursor, behind a change it had. Now the pool's
  connections (`FollowingConnection`) open again only to the master the sentinels name, and the
  pool closes without waiting on a paused peer. tests/publisher/bucket/redis/test_sentinel_pool.py
  `test_a_read_on_a_connection_closed_for_the_old_master_goes_to_the_new_one` (fails before).
- **The Spark writers counted fewer tries than writes** (a bug of the nemesis, not the product;
  seed 7, 90 s, `--spark`: "received, never acknowledged"). A failover can lose a try's write and
  its chunk key, so the next try writes the change again under another cursor; Spark retried a
  failed task inside its job, unseen by the writer, and the streaming writer recorded a failed
  micro-batch only when it gave up. Now Spark tries a task once (`local[1]`) and each failed
  micro-batch is a try of unknown outcome. tests/publisher/spark/test_stream.py
  `test_the_nemesis_stream_writer_publishes_once_across_a_failed_micro_batch`.
"""


def _faults(results: Sequence[Result]) -> str:
    kinds: Counter[str] = Counter(f.kind for r in results for f in r.faults)
    return ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items()))


def _seconds(values: Sequence[float]) -> str:
    if not values:
        return "—"
    return f"{statistics.median(values):.2f} s / {max(values):.2f} s"


def row(result: Result) -> str:
    j = result.judgement
    t = j.verdict.total
    soak = " + soak" if result.samples is not None else ""
    deliveries = t.received + t.covered
    outbox = result.outbox
    committed = f"{j.verdict.committed}" + (f" ({len(outbox.commits)} outbox)" if outbox else "")
    return (f"| {result.seed} | {result.duration:.0f} s{soak} | {len(result.faults)} "
            f"| {overlapping(result.faults)} | {result.switches} | {committed} "
            f"| {j.verdict.unknown} | {deliveries} | {t.lost} | {t.lost_announced} "
            f"| {t.duplicated} | {t.reordered} | {t.unacknowledged} | {t.maybe_received} "
            f"| {t.resyncs} | {sum(j.unjustified.values())} | {sum(j.redelivered.values())} "
            f"| {_seconds(result.recover)} | {'ok' if not j.problems() else '**FAIL**'} |")


HEADER = (
    "| seed | duration | faults | overlapping | master switches | commits acknowledged "
    "| outcome unknown | deliveries | lost | lost, announced | duplicated | reordered "
    "| never acknowledged | maybe | resyncs | unjustified | redelivered after ack "
    "| recovery p50 / max | verdict |\n"
    "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n"
)


RUNS = ("<!-- nemesis runs: begin -->", "<!-- nemesis runs: end -->")
SOAKS = ("<!-- nemesis soaks: begin -->", "<!-- nemesis soaks: end -->")
BUSY_SOAKS = ("<!-- nemesis busy soaks: begin -->", "<!-- nemesis busy soaks: end -->")
"""The markers of the section's three parts: the nemesis runs, the soaks, and the soaks on a
machine kept busy (`--busy`). A run writes the part of its kind and keeps the others as the
document has them, so a 30-minute soak, one on a busy machine and a set of seeded runs, made by
three commands, all stay in the section."""


def render(results: Sequence[Result], *, command: str, machine: str, date: str,
           commit: str, document: str = "", busy: int = 0) -> str:
    """The nemesis section for `results` (one command's, with `busy` cores kept busy), keeping
    from `document` the parts (runs, soaks, busy soaks) that `results` do not renew."""
    produced = f"Produced by `{command}` on {machine}, {date}, at commit `{commit}`."
    if busy:
        produced += f" {busy} other processes spun on the machine's cores throughout (`--busy`)."
    runs, soaks, busy_soaks = kinds(results, busy)
    lines = [BEGIN, "## Nemesis: many faults at once", "",
             "The test suite runs a 60-second nemesis and a 2-minute soak "
             f"(tests/faults/test_nemesis.py, seed {SEED}: a seed whose 60-second schedule "
             "draws every kind).", ""]
    lines += _part(RUNS, runs, produced, document, _runs)
    lines += _part(SOAKS, soaks, produced, document, _soaks)
    lines += _part(BUSY_SOAKS, busy_soaks, produced, document, _soaks)
    lines += [PROSE, END, ""]
    return "\n".join(lines)


def kinds(results: Sequence[Result], busy: int) -> tuple[list[Result], list[Result], list[Result]]:
    """`results` as the parts they renew: runs, soaks, and soaks on a busy machine."""
    runs = [r for r in results if r.samples is None]
    soaks = [r for r in results if r.samples is not None]
    return runs, ([] if busy else soaks), (soaks if busy else [])


def _part(markers: tuple[str, str], results: Sequence[Result], produced: str, document: str,
          body: Callable[[Sequence[Result]], list[str]]) -> list[str]:
    """One part: rendered from `results`, else as `document` has it (nothing when it has not)."""
    begin, end = markers
    if results:
        return [begin, produced, "", *body(results), end, ""]
    if begin in document and end in document:
        return [begin + document.partition(begin)[2].partition(end)[0] + end, ""]
    return []


def _runs(results: Sequence[Result]) -> list[str]:
    return [HEADER + "\n".join(row(r) for r in results), "",
            f"Faults injected, by kind: {_faults(results)}.", ""]


def _soaks(results: Sequence[Result]) -> list[str]:
    lines = [HEADER + "\n".join(row(r) for r in results), ""]
    for result in results:
        lines.append(f"Soak slopes of seed {result.seed} (per minute, second half of each "
                     "phase; the first half of the run without faults, the second with):")
        lines.append("")
        lines += [f"- {s.describe()}" for s in result.slopes]
        if result.faults and not any("(faults)" in s.component for s in result.slopes):
            lines.append("- with faults: no series is judged, as no process lived through "
                         "most of the second half of that phase (each was restarted by a "
                         "fault: its start is warm-up)")
        if result.samples is not None:
            lines.append(f"- churn: {result.samples.churned} listeners, "
                         f"{result.samples.resumed} resuming, {result.samples.slow} slow, "
                         f"{result.samples.refused} registrations refused")
        lines.append("")
    return lines


def splice(document: str, section: str) -> str:
    """`document` with its nemesis section replaced by `section` (appended when it has none)."""
    if BEGIN in document and END in document:
        head, _, rest = document.partition(BEGIN)
        _, _, tail = rest.partition(END)
        return head + section.rstrip("\n") + tail
    return document.rstrip("\n") + "\n\n" + section


def kept(document: str) -> str:
    """The nemesis section of `document` ('' when it has none)."""
    if BEGIN not in document or END not in document:
        return ""
    return BEGIN + document.partition(BEGIN)[2].partition(END)[0] + END + "\n"


__all__ = ["BEGIN", "BUSY_SOAKS", "END", "RUNS", "SOAKS", "kept", "kinds", "render", "row",
           "splice"]
