"""Durable pull consumers in Redis: the state of each, kept beside the bucket it reads.

`DurableStore` runs `durable.lua` (one script, an operation per call), each operation atomic on
one consumer's keys (`Keys.durable`):

    {name}:durable:<c>              hash: config, incarnation, epoch, position, counters
    {name}:durable:<c>:pending      sorted set: log id -> ms when it may be handed out again
    {name}:durable:<c>:items        hash: log id -> the item handed out (JSON), kept until settled
    {name}:durable:<c>:deliveries   hash: log id -> times handed out
    {name}:durable:<c>:dead         stream: the dead-letter record, bounded
    {name}:durables                 set: every durable consumer's name

An item handed out is copied into `items`, so trimming the log never loses an item that is
pending: it stays until an instance settles it or it is dead-lettered. What the consumer had not
read when it was trimmed is recorded as a `trimmed` gap. The position moves only through
`dispatch`, a compare-and-set on (epoch, position) as the caller read them, so instances reading
the log at once never hand out an item twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis

from changefeed.cursor import Position, StreamId
from changefeed.durable import Action, ConsumerConfig, DeliveryId, Outcome, Settled
from changefeed.protocol import ChangeItem
from publisher.bucket.lua.scripts import DURABLE
from publisher.bucket.redis.connection import translate_redis_errors
from publisher.bucket.values.changes import LogEntry
from publisher.bucket.values.keys import Keys

_OUTCOMES = {1: Outcome.APPLIED, 2: Outcome.REDELIVERED, 3: Outcome.NOT_PENDING,
             4: Outcome.CONSUMER_RECREATED}
COUNTERS = ("delivered", "redelivered", "acked", "nakked", "terminated", "dead", "gaps")


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def encode_item(entry: LogEntry, epoch: str) -> bytes:
    """What `items` keeps of an item handed out: enough to hand it out again after a trim."""
    return orjson.dumps([entry.resource, entry.sub_resources, entry.changed_resource_id, epoch])


def decode_item(position: StreamId, stored: bytes) -> ChangeItem:
    resource, subs, id, epoch = orjson.loads(stored)
    return LogEntry(position, resource, tuple(subs), id).item(epoch)


@dataclass(frozen=True, slots=True)
class Created:
    """`create`'s answer: `created` False when a consumer of that name existed, whose stored
    configuration (`config`, JSON) and incarnation are given."""

    created: bool
    config: bytes
    incarnation: str


@dataclass(frozen=True, slots=True)
class State:
    """A consumer's state in Redis, read in one snapshot."""

    fields: dict[str, str]
    pending: int
    dead_kept: int
    """Dead-letter records the bounded record still holds."""
    oldest_pending: StreamId | None
    next_deadline: int | None
    """Ms (Redis's clock) when the earliest pending item may be handed out again."""
    now: int

    @property
    def incarnation(self) -> str:
        return self.fields["incarnation"]

    @property
    def epoch(self) -> str:
        return self.fields["epoch"]

    @property
    def position(self) -> StreamId:
        return StreamId.parse(self.fields["position"])

    def counter(self, name: str) -> int:
        return int(self.fields.get(name, 0))


@dataclass(frozen=True, slots=True)
class Redelivered:
    """`redeliver`'s answer: the consumer's incarnation, epoch, position and configuration
    (JSON), and the items handed out again (position, delivery number, item)."""

    incarnation: str
    epoch: str
    position: StreamId
    config: bytes
    items: list[tuple[StreamId, int, ChangeItem]]
    pending: int
    next_deadline: int | None
    dead_lettered: int
    now: int


@dataclass(frozen=True, slots=True)
class Dispatched:
    """`dispatch`'s answer: `status` 1 done, 0 the position moved meanwhile (read again from
    `epoch` and `position`, as they are now), 2 the items do not fit under the consumer's most
    pending, 3 the consumer is gone."""

    status: int
    pending: int
    now: int
    epoch: str
    position: StreamId | None


@dataclass(frozen=True, slots=True)
class DeadRecord:
    """One record of the dead-letter record: its stream id, and its fields."""

    id: str
    fields: dict[str, str]


class DurableStore:
    """The durable consumers of one bucket, in its Redis."""

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys
        self._script = client.register_script(DURABLE.text)

    async def _run(self, name: str, args: Sequence[Any], what: str, sent: bool = False) -> Any:
        """Run one operation; `sent`: a lost answer means it may have run (a settlement)."""
        keys = [*self.keys.common, *self.keys.durable(name)]
        async with translate_redis_errors(f"durable consumer {what}", sent=sent):
            return await self._script(keys=keys, args=list(args))

    async def create(
        self, name: str, config: ConsumerConfig, incarnation: str, epoch: str,
        position: StreamId,
    ) -> Created:
        """Create consumer `name` unless it exists (then its stored configuration is given)."""
        status, stored, known = await self._run(
            name,
            ["create", config.encode(), incarnation, epoch, str(position), name,
             config.max_deliver, _ms(config.ack_wait), config.max_ack_pending],
            "create",
        )
        return Created(int(status) == 1, bytes(stored), known.decode())

    async def delete(self, name: str) -> bool:
        """Delete consumer `name` with its pending items and dead-letter record."""
        return bool(await self._run(name, ["delete", name], "delete"))

    async def state(self, name: str) -> State | None:
        reply = await self._run(name, ["info"], "info")
        if not reply:
            return None
        flat, pending, dead_kept, oldest, deadline, now = reply
        fields = {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}
        return State(
            fields, int(pending), int(dead_kept),
            StreamId.parse(oldest) if oldest else None,
            int(float(deadline)) if deadline else None, int(now),
        )

    async def redeliver(self, name: str, most: int, dead_max: int) -> Redelivered | None:
        """Hand out again up to `most` items whose deadline passed; None: no such consumer."""
        reply = await self._run(name, ["redeliver", most, dead_max], "redeliver")
        if not reply:
            return None
        incarnation, epoch, position, config, pending, deadline, buried, now, *rest = reply
        items = []
        for i in range(0, len(rest), 3):
            at = StreamId.parse(rest[i])
            items.append((at, int(rest[i + 1]), decode_item(at, rest[i + 2])))
        return Redelivered(
            incarnation.decode(), epoch.decode(), StreamId.parse(position), bytes(config), items,
            int(pending), int(float(deadline)) if deadline else None, int(buried), int(now),
        )

    async def dispatch(
        self,
        name: str,
        incarnation: str,
        epoch: str,
        position: StreamId,
        new_position: StreamId,
        gap: tuple[StreamId, StreamId] | None,
        new_epoch: str | None,
        dead_max: int,
        entries: Sequence[LogEntry],
    ) -> Dispatched:
        """Move the position from (`epoch`, `position`) to `new_position` (in `new_epoch` if
        the bucket was recreated) and hand out `entries`, if nobody moved it meanwhile."""
        args: list[Any] = [
            "dispatch", incarnation, epoch, str(position), str(new_position),
            "" if gap is None else str(gap[0]), "" if gap is None else str(gap[1]),
            new_epoch or "", dead_max,
        ]
        items_epoch = new_epoch or epoch
        for entry in entries:
            args += [str(entry.position), encode_item(entry, items_epoch)]
        status, pending, now, found_epoch, found = await self._run(name, args, "dispatch")
        return Dispatched(int(status), int(pending), int(now), found_epoch.decode(),
                          StreamId.parse(found) if found else None)

    async def settle(
        self, name: str, action: Action, deliveries: Sequence[DeliveryId], delay: float,
        dead_max: int,
    ) -> list[Settled] | None:
        """Settle each delivery; None when the consumer does not exist."""
        args: list[Any] = ["settle", action.value, _ms(delay), dead_max]
        for delivery in deliveries:
            args += [delivery.incarnation, str(delivery.position), delivery.number]
        reply = await self._run(name, args, action.value, sent=True)
        if not reply:
            return None
        return [
            Settled(delivery.encode(), _OUTCOMES[int(reply[2 * i])], bool(int(reply[2 * i + 1])))
            for i, delivery in enumerate(deliveries)
        ]

    async def dead_letters(self, name: str, after: str | None, count: int) -> list[DeadRecord]:
        """Up to `count` records of the dead-letter record after record id `after` (None: from
        the oldest kept), oldest first."""
        key = self.keys.durable(name)[4]
        start = "-" if after is None else f"({after}"
        async with translate_redis_errors("durable consumer dead letters"):
            rows: Any = await self.redis.xrange(key, start, "+", count=count)
        return [
            DeadRecord(entry_id.decode(), {k.decode(): v.decode() for k, v in fields.items()})
            for entry_id, fields in rows
        ]

    async def names(self) -> list[str]:
        key = self.keys.durable("")[5]
        async with translate_redis_errors("durable consumers"):
            found: Any = await self.redis.smembers(key)
        return sorted(name.decode() for name in found)


def dead_to_wire(record: DeadRecord, epoch: str) -> dict[str, Any]:
    """A dead-letter record as the `dead` route shows it: cursors instead of log ids, the item
    as listeners receive it."""
    fields = record.fields
    wire: dict[str, Any] = {"id": record.id, "reason": fields.get("reason", ""),
                            "at": int(fields.get("at", 0))}
    if "id" in fields:
        position = StreamId.parse(fields["id"])
        stored = fields.get("item", "")
        item = decode_item(position, stored.encode()) if stored else None
        wire["cursor"] = item.cursor if item else Position.single(epoch, position).encode()
        wire["deliveries"] = int(fields.get("deliveries", 0))
        if item is not None:
            wire["item"] = item.to_wire()
    old_epoch = fields.get("epoch", epoch)
    for key in ("after", "through"):
        if key in fields:
            wire[key] = Position.single(old_epoch, StreamId.parse(fields[key])).encode()
    if "epoch" in fields:
        wire["epoch"] = fields["epoch"]
    return wire


__all__ = [
    "COUNTERS",
    "Created",
    "DeadRecord",
    "Dispatched",
    "DurableStore",
    "Redelivered",
    "State",
    "dead_to_wire",
    "decode_item",
    "encode_item",
]
