"""Durable pull consumers: create, fetch with a long poll, settle, delete (the publisher's half;
the wire formats are `changefeed.durable`, the state in Redis `publisher.bucket.stores.durable`).

A fetch first hands out again the items whose deadline passed (an expired ack wait, a nak's
delay), then reads the log after the consumer's position, keeps what its filter matches (up to
the fetch's room and the consumer's most pending) and moves the position past what it read,
with a compare-and-set in Redis: instances fetching at once, on one publisher or several, never
get the same delivery. When nothing is there it waits, like `events`, on the hub's one shared
event for new log entries, on a settlement in this process (a nak or an ack may let something
through), or until the next deadline; a settlement made through another publisher is seen
within `RECHECK` seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from changefeed.cursor import ZERO, Position, StreamId, new_epoch
from changefeed.durable import (
    FIRST,
    LAST,
    Action,
    ConsumerConfig,
    DeliveryId,
    FetchReply,
    FetchRequest,
    Message,
    SettleReply,
    SettleRequest,
    stored_config,
)
from changefeed.errors import ConsumerExists, CursorGone, NoSuchConsumer
from changefeed.protocol import Resource
from changefeed.tasks import cancel_and_wait
from publisher.bucket import ChangeBucket, LogEntry
from publisher.bucket.stores.durable import COUNTERS, Redelivered, dead_to_wire
from publisher.config.settings import Durable as DurableSettings
from publisher.delivery.hub import Hub

SCAN = 1000
"""Log entries read per Redis call while looking for items that match a consumer's filter."""
SCANS = 10
"""Reads of the log one fetch round makes at most before it answers (or reads again)."""
RECHECK = 1.0
"""Seconds a waiting fetch sleeps at most before it looks again: the bound on how late it sees
a nak or an ack made through another publisher."""


class Durables:
    """The durable consumers of one bucket, as one publisher process serves them."""

    def __init__(
        self,
        bucket: ChangeBucket,
        hub: Hub,
        settings: DurableSettings,
        resources: Mapping[str, Resource],
    ) -> None:
        self.bucket = bucket
        self.store = bucket.durables
        self.hub = hub
        self.settings = settings
        self.resources = resources
        self._configs: dict[bytes, ConsumerConfig] = {}
        """Stored configurations, parsed once (one per consumer name, configured names only)."""
        self._settled: dict[str, asyncio.Event] = {}
        """Per consumer: set (and replaced) when a settlement or a delete in this process may
        let a waiting fetch go on."""

    def config_of(self, stored: bytes) -> ConsumerConfig:
        config = self._configs.get(stored)
        if config is None:
            if len(self._configs) > 4 * max(1, len(self.settings.consumers)):
                self._configs.clear()
            config = self._configs[stored] = stored_config(stored, self.resources)
        return config

    # --- lifecycle -------------------------------------------------------------------------

    async def create(self, name: str, config: ConsumerConfig) -> tuple[bool, dict[str, Any]]:
        """Create consumer `name` with `config`; (False, info) when it exists with the same
        configuration. Raises ConsumerExists when it exists with another, CursorGone when
        `start` is a cursor the log no longer retains (or of another bucket epoch)."""
        state = await self.store.state(name)
        if state is None:
            epoch, position = await self._start(config.start)
            created = await self.store.create(name, config, new_epoch(), epoch, position)
            stored = created.config
        else:
            created = None
            stored = state.fields["config"].encode()
        existing = self.config_of(stored)
        if existing != config:
            raise ConsumerExists(name, existing.differences(config))
        return created is not None and created.created, await self.info(name)

    async def _start(self, start: str) -> tuple[str, StreamId]:
        """The epoch and the position a new consumer starts after."""
        retention = await self.bucket.log.retention()
        if retention.epoch is None:
            await self.bucket.log.ensure()
            retention = await self.bucket.log.retention()
        epoch = retention.epoch or ""
        if start == FIRST:
            return epoch, retention.trimmed
        if start == LAST:
            return epoch, retention.head
        cursor = Position.decode_single(start)
        if cursor.epoch != epoch:
            raise CursorGone(
                f"start: cursor {start!r} is of another bucket epoch (the bucket was recreated)"
            )
        if cursor.position < retention.trimmed:
            raise CursorGone(
                f"start: cursor {start!r} is older than the retained log: items after it were "
                "trimmed (start from 'first', after re-reading the state)"
            )
        return epoch, cursor.position

    async def delete(self, name: str) -> bool:
        existed = await self.store.delete(name)
        self._poke(name)
        return existed

    async def info(self, name: str) -> dict[str, Any]:
        """What `GET /changefeeds/durable/<name>` shows. Raises NoSuchConsumer."""
        state = await self.store.state(name)
        if state is None:
            raise NoSuchConsumer(name)
        config = self.config_of(state.fields["config"].encode())
        epoch = state.epoch
        counts = {key: state.counter(key) for key in COUNTERS}
        counts["dead_lettered"] = counts.pop("dead")
        return {
            "name": name,
            "config": config.to_wire(),
            "created": int(state.fields.get("created", 0)),
            "incarnation": state.incarnation,
            "position": Position.single(epoch, state.position).encode(),
            "pending": state.pending,
            "oldest_pending": None if state.oldest_pending is None
            else Position.single(epoch, state.oldest_pending).encode(),
            "next_redelivery": state.next_deadline,
            "counts": counts,
            "dead_letters": {"kept": state.dead_kept,
                             "dropped": max(0, counts["dead_lettered"] - state.dead_kept)},
        }

    async def dead_letters(self, name: str, after: str | None, limit: int) -> dict[str, Any]:
        """Up to `limit` records of the consumer's dead-letter record after record `after`."""
        state = await self.store.state(name)
        if state is None:
            raise NoSuchConsumer(name)
        records = await self.store.dead_letters(name, after, limit + 1)
        return {
            "records": [dead_to_wire(r, state.epoch) for r in records[:limit]],
            "more": len(records) > limit,
            "dropped": max(0, state.counter("dead") - state.dead_kept),
        }

    # --- fetch -----------------------------------------------------------------------------

    async def fetch(self, name: str, request: FetchRequest) -> FetchReply:
        """Up to `request.max_messages` messages, waiting up to `request.wait` seconds for the
        first. Raises NoSuchConsumer."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.wait
        dead = 0
        while True:
            red = await self.store.redeliver(
                name, request.max_messages, self.settings.max_dead_letters
            )
            if red is None:
                raise NoSuchConsumer(name)
            config = self.config_of(red.config)
            messages = [
                Message(item, DeliveryId(red.incarnation, position, number).encode(), number)
                for position, number, item in red.items
            ]
            dead += red.dead_lettered
            pending = red.pending
            room = min(request.max_messages - len(messages), config.max_ack_pending - pending)
            past: StreamId | None = None
            if room > 0:
                new, pending, gaps, past = await self._dispatch(name, red, config, room)
                messages += new
                dead += gaps
            remaining = deadline - loop.time()
            if messages or remaining <= 0 or self.hub.waiters.released:
                return FetchReply(tuple(messages), pending, dead)
            if past is None and room > 0:
                continue  # more of the log to read: no waiting
            wait = min(remaining, RECHECK)
            if red.next_deadline is not None:
                wait = min(wait, max(0.001, (red.next_deadline - red.now) / 1000))
            await self._wait(name, past, wait)

    async def _dispatch(
        self, name: str, red: Redelivered, config: ConsumerConfig, room: int
    ) -> tuple[list[Message], int, int, StreamId | None]:
        """Hand out up to `room` new items of the log after the consumer's position: the
        messages, the pending count, the dead-letter records written (gaps, a new epoch) and
        the head the log was read to (None when more is left to read)."""
        epoch, position = red.epoch, red.position
        out: list[Message] = []
        pending = red.pending
        dead = 0
        for _ in range(SCANS):
            read = await self.bucket.log.tail(position, None, SCAN)
            if read.epoch is None:
                return out, pending, dead, read.head  # no bucket yet: wait for a commit
            renewed = None
            base = position
            if read.epoch != epoch:
                renewed = read.epoch  # the bucket was recreated: its new log from the start
                base = ZERO
                read = await self.bucket.log.tail(ZERO, None, SCAN)
                if read.epoch != renewed:
                    continue
            gap = (base, read.trimmed) if read.trimmed > base else None
            chosen: list[LogEntry] = []
            moved = max(base, read.trimmed)
            for entry in read.entries:
                if config.filter.matches(entry):
                    if len(chosen) == room:
                        break
                    chosen.append(entry)
                moved = entry.position
            if renewed is None and gap is None and moved == position:
                return out, pending, dead, read.head
            done = await self.store.dispatch(
                name, red.incarnation, epoch, position, moved, gap, renewed,
                self.settings.max_dead_letters, chosen,
            )
            if done.status == 3:
                raise NoSuchConsumer(name)
            if done.status in (0, 2):
                if done.position is None:
                    raise NoSuchConsumer(name)
                epoch, position, pending = done.epoch, done.position, done.pending
                room = min(room, config.max_ack_pending - pending)
                if room <= 0:
                    return out, pending, dead, None
                continue
            items_epoch = renewed or epoch
            out += [
                Message(e.item(items_epoch), DeliveryId(red.incarnation, e.position, 1).encode(), 1)
                for e in chosen
            ]
            dead += (gap is not None) + (renewed is not None)
            epoch, position, pending = items_epoch, moved, done.pending
            room -= len(chosen)
            if room <= 0:
                return out, pending, dead, read.head
            if read.complete:
                return out, pending, dead, max(read.head, moved)
        return out, pending, dead, None

    async def _wait(self, name: str, past: StreamId | None, seconds: float) -> None:
        """Wait up to `seconds` for the log to pass `past` (None: do not wait for the log), or a
        settlement of consumer `name` in this process."""
        waits: list[asyncio.Future[bool]] = [asyncio.ensure_future(self._event(name).wait())]
        if past is not None:
            waits.append(asyncio.ensure_future(self.hub.wait_past(past, seconds)))
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(*waits)

    # --- settling --------------------------------------------------------------------------

    async def settle(self, name: str, action: Action, request: SettleRequest) -> SettleReply:
        """Settle the deliveries of `request`; each result says whether it took effect. Raises
        NoSuchConsumer."""
        results = await self.store.settle(
            name, action, request.deliveries, request.delay, self.settings.max_dead_letters
        )
        if results is None:
            raise NoSuchConsumer(name)
        if any(result.applied for result in results):
            self._poke(name)
        return SettleReply(tuple(results))

    def _event(self, name: str) -> asyncio.Event:
        event = self._settled.get(name)
        if event is None:
            event = self._settled[name] = asyncio.Event()
        return event

    def _poke(self, name: str) -> None:
        event = self._settled.pop(name, None)
        if event is not None:
            event.set()


__all__ = ["RECHECK", "SCAN", "SCANS", "Durables"]
