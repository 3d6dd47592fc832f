"""The oracle's accounting (faults/oracle.py), on hand-written histories: pure, synchronous.

A history is written as a script of steps, applied in order (each gets the next logical stamp):

    ("ack", id, seq, cursor)      the writer was told `cursor`
    ("unknown", id, seq)          the commit's outcome is unknown
    ("failed", id, seq)           the commit failed: nothing written
    ("change", cursor, id)        the listener delivered a Change
    ("resync",)                   the listener delivered a Resync
    ("bootstrap", {id: seq})      the listener completed a bootstrap with these objects
    ("half-bootstrap", {id: seq}) a bootstrap started and delivered these, then started over
"""

from __future__ import annotations

from typing import Any

import pytest

from faults.oracle import History, Tally
from faults.records import ListenerLog


def run(steps: list[tuple[Any, ...]], resumes_after: int = 0) -> Tally:
    """The tally of listener "l", created at its first step; it is not owed the first
    `resumes_after` acknowledged commits (it resumed after the cursor of the last of them)."""
    history = History()
    log: ListenerLog | None = None
    for step in steps:
        if log is None and step[0] not in ("ack", "unknown", "failed"):
            since = history.acked[resumes_after - 1] if resumes_after else None
            log = history.listener("l", after=since)
        match step:
            case ("ack", id, seq, cursor):
                history.acknowledged(id, seq, cursor, 0.0)
            case ("unknown", id, seq):
                history.unknown(id, seq, 0.0)
            case ("failed", id, seq):
                history.failed(id, seq, 0.0)
            case ("change", cursor, id):
                assert log is not None
                log.change(cursor, id, 0.0)
            case ("resync",):
                assert log is not None
                log.resync("test", 0.0)
            case ("bootstrap", states):
                assert log is not None
                log.bootstrap_start()
                log.bootstrap_records(states.items())
                log.bootstrap_done(0.0)
            case ("half-bootstrap", states):
                assert log is not None
                log.bootstrap_start()
                log.bootstrap_records(states.items())
    if log is None:
        log = history.listener("l")
    return history.verdict().listeners["l"]


CASES: list[tuple[str, list[tuple[Any, ...]], dict[str, int]]] = [
    ("every change once, in order",
     [("bootstrap", {}), ("ack", "a", 1, "e.1"), ("ack", "b", 2, "e.2"),
      ("change", "e.1", "a"), ("change", "e.2", "b")],
     {"owed": 2, "received": 2, "lost": 0}),
    ("a change never delivered, nothing announced: lost",
     [("bootstrap", {}), ("ack", "a", 1, "e.1"), ("ack", "b", 2, "e.2"),
      ("change", "e.2", "b")],
     {"received": 1, "lost": 1}),
    ("a later change of the same id does not excuse the missed one",
     [("bootstrap", {}), ("ack", "a", 1, "e.1"), ("ack", "a", 2, "e.2"),
      ("change", "e.2", "a")],
     {"received": 1, "lost": 1}),
    ("covered: a later bootstrap delivered the id at that state",
     [("bootstrap", {}), ("ack", "a", 1, "e.1"), ("resync",), ("bootstrap", {"a": 1})],
     {"covered": 1, "lost": 0, "lost_announced": 0, "resyncs": 1}),
    ("covered: ... or at a later state",
     [("bootstrap", {}), ("ack", "a", 1, "e.1"), ("ack", "a", 5, "e.2"), ("resync",),
      ("bootstrap", {"a": 5})],
     {"covered": 2, "lost": 0}),
    ("not covered by an older state of the id",
     [("bootstrap", {}), ("ack", "a", 3, "e.1"), ("bootstrap", {"a": 2})],
     {"covered": 0, "lost": 1}),
    ("a bootstrap that started over does not count",
     [("bootstrap", {}), ("ack", "a", 1, "e.1"), ("half-bootstrap", {"a": 1})],
     {"covered": 0, "lost": 1}),
    ("gone from the store but a Resync followed: lost, announced",
     [("bootstrap", {}), ("ack", "a", 1, "e.1"), ("resync",), ("bootstrap", {})],
     {"lost": 0, "lost_announced": 1}),
    ("a Resync before the commit announces nothing about it",
     [("bootstrap", {}), ("resync",), ("bootstrap", {}), ("ack", "a", 1, "e.1")],
     {"lost": 1, "lost_announced": 0}),
    ("the initial bootstrap covers what came before the listener",
     [("ack", "a", 1, "e.1"), ("ack", "b", 2, "e.2"), ("bootstrap", {"a": 1, "b": 2})],
     {"owed": 2, "covered": 2, "lost": 0}),
    ("duplicated: the same change twice",
     [("bootstrap", {}), ("ack", "a", 1, "e.1"), ("change", "e.1", "a"),
      ("change", "e.1", "a")],
     {"received": 1, "duplicated": 1}),
    ("reordered: a change after one of a later cursor",
     [("bootstrap", {}), ("ack", "a", 1, "e.1"), ("ack", "b", 2, "e.2"),
      ("change", "e.2", "b"), ("change", "e.1", "a")],
     {"received": 2, "reordered": 1}),
    ("a new epoch after a Resync starts the order over",
     [("bootstrap", {}), ("ack", "a", 1, "x.9"), ("change", "x.9", "a"), ("resync",),
      ("bootstrap", {}), ("ack", "b", 2, "y.1"), ("change", "y.1", "b")],
     {"received": 2, "reordered": 0}),
    ("unacknowledged: a change the writer never heard of",
     [("bootstrap", {}), ("failed", "a", 1), ("change", "e.1", "a")],
     {"unacknowledged": 1, "maybe_received": 0}),
    ("an unknown outcome that was written is no error",
     [("bootstrap", {}), ("unknown", "a", 1), ("change", "e.1", "a")],
     {"unacknowledged": 0, "maybe_received": 1}),
    ("one unknown outcome excuses one cursor of its id only",
     [("bootstrap", {}), ("unknown", "a", 1), ("change", "e.1", "a"), ("change", "e.2", "a")],
     {"unacknowledged": 1, "maybe_received": 1}),
    ("failed and unknown commits are not owed",
     [("bootstrap", {}), ("failed", "a", 1), ("unknown", "b", 2)],
     {"owed": 0, "lost": 0}),
]


@pytest.mark.parametrize(("steps", "expected"), [(s, e) for _, s, e in CASES],
                         ids=[name for name, _, _ in CASES])
def test_tally(steps: list[tuple[Any, ...]], expected: dict[str, int]) -> None:
    tally = run(steps)
    assert {key: getattr(tally, key) for key in expected} == expected


def test_a_resuming_listener_is_owed_only_what_follows_its_cursor() -> None:
    steps = [("ack", "a", 1, "e.1"), ("ack", "b", 2, "e.2"), ("ack", "c", 3, "e.3"),
             ("change", "e.3", "c")]
    tally = run(steps, resumes_after=2)
    assert (tally.owed, tally.received, tally.lost) == (1, 1, 0)


def test_problems_name_the_listener_and_the_count() -> None:
    history = History()
    history.acknowledged("a", 1, "e.1", 0.0)
    history.listener("quiet")
    log = history.listener("twice")
    log.change("e.1", "a", 0.0)
    log.change("e.1", "a", 0.0)
    log.error("closed 1013")
    verdict = history.verdict()
    assert verdict.problems() == ["quiet: lost=1", "twice: duplicated=1", "twice: errors=1"]
    assert verdict.total.owed == 2 and verdict.committed == 1


def test_first_delivery_after_counts_changes_and_completed_bootstraps() -> None:
    history = History()
    log = history.listener("l")
    log.change("e.1", "a", 1.0)
    log.bootstrap_start()
    log.bootstrap_done(3.0)
    log.change("e.2", "a", 4.0)
    assert log.first_delivery_after(0.5) == 1.0
    assert log.first_delivery_after(2.0) == 3.0
    assert log.first_delivery_after(5.0) is None


def test_a_coalesced_item_receives_the_changes_of_its_id_up_to_its_cursor() -> None:
    history = History()
    history.acknowledged("a", 1, "e.01", 0.0)
    history.acknowledged("a", 2, "e.02", 0.0)
    history.acknowledged("a", 3, "e.03", 0.0)
    log = history.listener("l")
    log.change("e.02", "a", 0.0, coalesced=True)  # stands for e.01 and e.02
    log.change("e.01", "a", 0.0)  # an interrupted catch-up resumed before it: allowed again
    log.change("e.02", "a", 0.0)
    log.change("e.03", "a", 0.0)
    tally = history.verdict().listeners["l"]
    assert (tally.received, tally.lost, tally.duplicated, tally.reordered) == (3, 0, 0, 0)


def test_an_at_least_once_log_may_repeat_until_the_ack() -> None:
    history = History()
    history.acknowledged("a", 1, "e.01", 0.0)
    history.acknowledged("b", 1, "e.02", 0.0)
    log = history.listener("d", at_least_once=True)
    log.change("e.02", "b", 0.0)
    log.change("e.01", "a", 0.0)
    log.change("e.01", "a", 0.0)  # redelivered before its ack
    log.acked("e.01", "a", 0.0)
    log.change("f.01", "a", 0.0)  # the same item under a new epoch, after the ack
    tally = history.verdict().listeners["d"]
    assert (tally.received, tally.duplicated, tally.reordered, tally.unacknowledged) == (2, 0, 0, 0)
    assert [(ack.cursor, again.cursor) for ack, again in log.redelivered_after_ack()] == [
        ("e.01", "f.01")]


def test_an_item_of_unknown_outcome_under_two_epochs_is_one_maybe() -> None:
    history = History()
    history.unknown("a", 1, 0.0)
    log = history.listener("l")
    log.change("e.01", "a", 0.0)
    log.resync("rolled back", 0.0)
    log.change("f.01", "a", 0.0)  # the same log item after the epoch was renewed
    tally = history.verdict().listeners["l"]
    assert (tally.maybe_received, tally.unacknowledged) == (1, 0)


def test_a_resync_after_a_commit_was_sent_announces_its_loss_though_it_was_acked_later() -> None:
    """A commit retried under its key after an unknown outcome: its first try wrote it, a
    reader without a bootstrap was then told to start over (a Resync) from a head past it, and
    the retry was acknowledged after that Resync, with the first try's cursor (nemesis seed
    5203: `changefeed publish` waiting for its replica). Its effect lies between its first try
    and its acknowledgement: the Resync announced it."""
    history = History()
    sent = history.tick()
    log = history.listener("sse")
    log.resync("cannot resume: bootstrap again", 2.0)
    history.acknowledged("cli-13", 5, "e.05", 3.0, since=sent)
    history.acknowledged("cli-14", 6, "e.06", 3.5)  # sent after the Resync: owed
    tally = history.verdict().listeners["sse"]
    assert (tally.lost_announced, tally.lost) == (1, 1)


def _batch(history: History, batch: str, *cursors: str) -> None:
    for n, cursor in enumerate(cursors):
        history.acknowledged(f"b{n}", 1, cursor, 0.0, batch=batch)


def test_an_atomic_commit_seen_in_part_or_split_by_a_resync_is_counted() -> None:
    history = History()
    _batch(history, "k1", "e.01", "e.02")
    _batch(history, "k2", "e.03", "e.04")
    _batch(history, "k3", "e.05", "e.06")
    whole, half, torn = (history.listener(n) for n in ("whole", "half", "torn"))
    for log in (whole, half, torn):
        log.change("e.01", "b0", 0.0)
        log.change("e.02", "b1", 0.0)
    whole.change("e.03", "b0", 0.0)
    whole.change("e.04", "b1", 0.0)
    half.change("e.03", "b0", 0.0)  # k2's second change never came
    torn.change("e.03", "b0", 0.0)
    torn.resync("test", 0.0)  # a resync between k2's changes
    torn.change("e.04", "b1", 0.0)
    listeners = history.verdict().listeners
    assert listeners["whole"].split == 0
    assert listeners["half"].split == 1
    assert listeners["torn"].split == 1
    assert "half: split=1" in history.verdict().findings()
    assert not any("split" in problem for problem in history.verdict().problems())


def test_a_resumed_reader_given_again_what_it_had_or_skipping_a_change_is_counted() -> None:
    history = History()
    for n in range(1, 5):
        history.acknowledged(f"v{n}", 1, f"e.0{n}", 0.0)
    exact, again, skipped = (history.listener(n) for n in ("exact", "again", "skipped"))
    for log in (exact, again, skipped):
        log.change("e.01", "v1", 0.0)
        log.change("e.02", "v2", 0.0)
        log.resumed("e.02", 0.0)
    exact.change("e.03", "v3", 0.0)
    exact.change("e.04", "v4", 0.0)
    again.change("e.01", "v1", 0.0)  # from the oldest: issue 30's 400 items again
    skipped.change("e.04", "v4", 0.0)  # e.03 followed the cursor and never came
    listeners = history.verdict().listeners
    assert listeners["exact"].unresumable == 0
    assert listeners["again"].unresumable == 1
    assert listeners["skipped"].unresumable == 1


def test_a_change_of_a_new_epoch_before_the_reader_was_told_is_counted() -> None:
    history = History()
    history.acknowledged("v1", 1, "old.01", 0.0)
    history.acknowledged("v2", 1, "new.02", 0.0)
    resynced, told, silent = (history.listener(n) for n in ("resynced", "told", "silent"))
    for log in (resynced, told, silent):
        log.change("old.01", "v1", 0.0)
    resynced.resync("4009", 0.0)
    told.told_epoch("old.01", 0.0)  # resume_after: its position in the new epoch
    for log in (resynced, told, silent):
        log.change("new.02", "v2", 0.0)
    listeners = history.verdict().listeners
    assert listeners["resynced"].unannounced == 0
    assert listeners["told"].unannounced == 0
    assert listeners["silent"].unannounced == 1


def test_a_durable_consumers_shared_at_least_once_log_is_not_asked_to_be_atomic_or_announced(
) -> None:
    history = History()
    _batch(history, "k1", "old.01", "old.02")
    history.acknowledged("v", 1, "new.03", 0.0)
    log = history.listener("durable", at_least_once=True)
    log.change("old.01", "b0", 0.0)  # one instance; the other's part never came
    log.change("new.03", "v", 0.0)  # the dead-letter record of reason epoch is read later
    tally = history.verdict().listeners["durable"]
    assert tally.split == 0 and tally.unannounced == 0


def test_composite_cursors_of_one_epoch_are_one_epoch() -> None:
    """A Redis Cluster bucket's cursors (`<epoch>~<p0>~<p1>`) name their epoch before the first
    `~`: changes under one epoch are not an epoch change, two epochs are."""
    from faults import watch

    assert watch._epoch("k2v9q4xab2~0192f3a4b5c6a3~0") == "k2v9q4xab2"
    assert watch._epoch("k2v9q4xab2.0192f3a4b5c6a3") == "k2v9q4xab2"
    assert watch._position("k2v9q4xab2~01~02") == "01~02"
