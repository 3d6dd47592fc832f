"""`--wait-seen-by` with the composite cursors of a bucket in a Redis Cluster: a registration was
sent a commit when its lastCursorSent is at or past the commit's position in its partition."""

from __future__ import annotations

from changefeed.cursor import ZERO, Position, StreamId
from publisher.cli.seen import seen_by


def test_composite_last_cursors_count_per_partition() -> None:
    epoch = "abcdefghij"
    wanted = Position.decode(Position.at(epoch, 2, 1, StreamId(50, 0)))

    def reg(instance: str, sent: str | None) -> dict[str, object]:
        return {"service": "tcns", "changeKind": {"resource": "vm", "subResources": ["nic"]},
                "publisher": "p", "instance": instance, "remote": "r", "connectedSince": "t",
                "lastCursorSent": sent}

    registrations = [
        reg("ahead", Position(epoch, (ZERO, StreamId(60, 0))).encode()),
        reg("behind", Position(epoch, (StreamId(99, 0), StreamId(49, 9))).encode()),
        reg("foreign", Position("zzzzzzzzzz", (ZERO, StreamId(60, 0))).encode()),
        reg("single", "abcdefghij.0000000000c8a0"),
        reg("none", None),
    ]
    assert seen_by(registrations, "tcns", "vm", ["nic"], "vm-1", wanted) == (5, 1)
