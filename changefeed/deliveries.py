"""What a durable consumer hands out, and how it is settled: `DeliveryId` (one hand-out of one
item), `Action` (ack, nak, in_progress, term), `Outcome` (what a settlement did) and
`DeadReason` (why a dead-letter record was written). Pure code; `changefeed.durable` re-exports
every name, the wire forms of the requests and replies that carry them are there.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

from changefeed.cursor import StreamId
from changefeed.errors import ParamError

_INCARNATION = re.compile(r"^[a-z2-7]{10}$")
_DELIVERY = re.compile(r"^([a-z2-7]{10}):([0-9]{1,20})-([0-9]{1,20}):([0-9]{1,9})$")


class Action(enum.Enum):
    """What a settlement does to a delivery (the last path segment of its route)."""

    ACK = "ack"
    """Done: the item is settled and never handed out again."""
    NAK = "nak"
    """Not done: hand it out again after `delay` seconds (0: at once)."""
    IN_PROGRESS = "in_progress"
    """Still working on it: the ack wait starts again from now."""
    TERM = "term"
    """Never to be done: the item goes to the dead-letter record (reason `terminated`)."""


class Outcome(enum.Enum):
    """What a settlement did. Only `APPLIED` changed anything."""

    APPLIED = "applied"
    """It took effect."""
    REDELIVERED = "redelivered"
    """The ack wait passed and the item was handed out again since (to this instance or another):
    only the newer delivery may settle it. Nothing changed."""
    NOT_PENDING = "not_pending"
    """The item is not waiting for a settlement: already acknowledged (by this or another
    instance), dead-lettered, or never handed out. Nothing changed."""
    CONSUMER_RECREATED = "consumer_recreated"
    """The delivery is of an earlier consumer of that name, deleted since. Nothing changed."""


class DeadReason(enum.Enum):
    """Why a dead-letter record was written."""

    MAX_DELIVERIES = "max_deliveries"
    """Handed out `max_deliver` times without an ack: the item is settled as dead."""
    TERMINATED = "terminated"
    """An instance terminated it (`term`)."""
    TRIMMED = "trimmed"
    """Items after `after` up to `through` were trimmed from the log (maxAge, maxItems) before
    the consumer read them: which of them matched its filter is not known."""
    EPOCH = "epoch"
    """The bucket was recreated (a new epoch): the items of the old log after `after` that the
    consumer had not read are gone; it goes on from the start of the new log."""


@dataclass(frozen=True, slots=True, order=True)
class DeliveryId:
    """One hand-out of one item: `<incarnation>:<ms>-<seq>:<number>`.

    `incarnation` tells a consumer from an earlier one of the same name; `position` is the item's
    place in the log; `number` counts its deliveries (1 for the first): a delivery whose number
    is no longer the item's latest was overtaken by a redelivery.
    """

    incarnation: str
    position: StreamId
    number: int

    def encode(self) -> str:
        return f"{self.incarnation}:{self.position}:{self.number}"

    def __str__(self) -> str:
        return self.encode()

    @classmethod
    def decode(cls, text: Any) -> DeliveryId:
        """Raises ParamError when `text` is not a delivery id."""
        match = _DELIVERY.match(text) if isinstance(text, str) else None
        if match is None or int(match.group(4)) < 1:
            raise ParamError(
                f"{str(text)[:80]!r} is not a delivery id (<incarnation>:<ms>-<seq>:<n>)"
            )
        incarnation, ms, seq, number = match.groups()
        return cls(incarnation, StreamId(int(ms), int(seq)), int(number))


def valid_incarnation(text: str) -> bool:
    return bool(_INCARNATION.match(text))


__all__ = ["Action", "DeadReason", "DeliveryId", "Outcome", "valid_incarnation"]
