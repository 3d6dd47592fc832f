"""The subscribers of a publisher process: a registered connection (`Subscriber`), and the index
(`Routes`) of which connections an item goes to. Pure code (the hub writes to them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any, Protocol

from changefeed.cursor import ZERO, StreamId
from changefeed.protocol import WILDCARD, ChangeKind, Registration
from changefeed.watch import prefixes_of
from publisher.bucket import LogEntry
from publisher.delivery.coalesce import Coalesced
from publisher.delivery.decision import Mode, mode_of
from publisher.delivery.window import WindowEntry

if TYPE_CHECKING:
    from publisher.security.auth import Identity


class Transport(Protocol):
    def write(self, data: bytes) -> None: ...
    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...
    def get_write_buffer_size(self) -> int: ...
    def is_closing(self) -> bool: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


@dataclass(eq=False, slots=True)
class Subscriber:
    """A registered websocket: what it listens for and how far it has been sent."""

    registration: Registration
    transport: Transport
    protocol: Any
    """aiohttp's protocol of the connection: its drain waits for the transport buffer."""
    remote: str
    connected_at: float = field(default_factory=time.time)
    live: bool = True
    """Written to directly by the fan-out; False while it catches up in its own task."""
    position: StreamId = ZERO
    """While not live: the last entry it was sent or that did not match it."""
    last_sent: StreamId | None = None
    replaying: bool = False
    """Resuming from `since`: may read what it missed from Redis, not only from the window."""
    closing: bool = False
    quiet: int = 0
    """Keepalive sweeps (publisher.delivery.pings) since the listener last sent anything."""
    task: asyncio.Task[None] | None = None
    kinds: dict[str, ChangeKind] = field(default_factory=dict)
    """The registration's change kinds by resource."""
    sse: bool = False
    """A server-sent events stream (publisher.web.sse), not a websocket: written `WindowEntry.sse`
    chunks instead of frames, and a `close` event instead of a close frame."""
    identity: Identity | None = None
    """Who registered it, checked again when credentials are reloaded or expire
    (publisher.web.revocation); None: not checked."""
    coalesced: Coalesced | None = None
    """Set while it is in a coalesced catch-up (registered with `coalesce`, fell out of the
    window): every item for it is folded in here instead of being sent."""
    mode: Mode = field(init=False)
    """Its delivery mode (publisher.delivery.decision.mode_of), kept by the methods below as its
    state changes, so that the fan-out decides with it and its transport's facts alone."""

    def __post_init__(self) -> None:
        self.kinds = {kind.resource: kind for kind in self.registration.kinds}
        self._moved()

    def _moved(self) -> None:
        self.mode = mode_of(self.live, self.sse, self.coalesced is not None, self.closing)

    def written_as(self) -> Mode:
        """Its mode as if it were live: what its own catch-up asks the decision with."""
        return mode_of(True, self.sse, False, self.closing)

    def sent(self, position: StreamId) -> None:
        """It was written the item at window position `position`."""
        self.last_sent = position

    @staticmethod
    def all_sent(conns: Iterable[Subscriber], position: StreamId) -> None:
        """Each of `conns` was written the item at window position `position` (`sent`, once
        per item for all the connections of a fan-out)."""
        for conn in conns:
            conn.last_sent = position

    def passed(self, position: StreamId) -> None:
        """Catching up: it was sent, or did not want, everything up to `position`."""
        self.position = position

    def fall_behind(self, position: StreamId) -> None:
        """Not live any more: it catches up from `position` (the last entry it was sent)."""
        self.live = False
        self.position = position
        self._moved()

    def resume_at(self, position: StreamId) -> None:
        """Registered behind the window head: replays what it missed, then catches up from
        window position `position`."""
        self.live = False
        self.replaying = True  # not closed as slow while it replays from Redis
        self.position = position
        self._moved()

    def coalesce(self, limit: int) -> Coalesced:
        """Switched to a coalesced catch-up of at most `limit` ids: its set, empty."""
        self.coalesced = coalesced = Coalesced(limit)
        self._moved()
        return coalesced

    def go_live(self) -> None:
        """Caught up: written by the fan-out again."""
        self.live = True
        self.replaying = False
        self.coalesced = None
        self.task = None
        self._moved()

    def follow(self, task: asyncio.Task[None]) -> None:
        """`task` catches it up (or resumes it); cancelled when it is removed."""
        self.task = task

    def close(self) -> bool:
        """Mark it closing; False when it was already."""
        if self.closing:
            return False
        self.closing = True
        self._moved()
        return True

    def heard(self) -> None:
        """The listener sent something (the keepalive's count starts again)."""
        self.quiet = 0

    def swept(self) -> int:
        """A keepalive sweep looked at it: the sweeps it was silent before this one."""
        quiet = self.quiet
        self.quiet = quiet + 1
        return quiet

    def identified(self, identity: Identity) -> None:
        """Its credentials, checked again, are `identity` now."""
        self.identity = identity

    def wants(self, entry: WindowEntry | LogEntry) -> bool:
        """True when `entry` is for this connection: its sub-resources and its watch."""
        kind = self.kinds.get(entry.resource)
        return kind is not None and kind.matches_item(
            entry.sub_resources, entry.changed_resource_id
        )


Table = dict[str, dict[str, set[Subscriber]]]
"""resource -> key (a sub-resource, an id or an id prefix) -> connections."""


class Routes:
    """Which connections an item goes to. Pure: no I/O.

    A change kind that watches every id is indexed by its sub-resources: an item costs one lookup
    per sub-resource it carries. One with a watch is indexed by its exact ids and its prefixes
    instead, so the many connections that each watch a few ids are not visited for every item of
    their resource: an item looks up its id and each of its `/`-separated prefixes (the State
    Watch pattern's walk up the hierarchy), then checks the sub-resources of those found.
    """

    def __init__(self) -> None:
        self._by_sub: Table = {}
        self._by_id: Table = {}
        self._by_prefix: Table = {}

    def _keys(self, kind: ChangeKind) -> Iterator[tuple[Table, Iterable[str]]]:
        if kind.watch.everything:
            yield self._by_sub, kind.sub_resources
        else:
            yield self._by_id, kind.watch.ids
            yield self._by_prefix, kind.watch.prefixes

    def add(self, conn: Subscriber) -> None:
        for kind in conn.registration.kinds:
            for table, keys in self._keys(kind):
                by_key = table.setdefault(kind.resource, {})
                for key in keys:
                    by_key.setdefault(key, set()).add(conn)

    def remove(self, conn: Subscriber) -> None:
        for kind in conn.registration.kinds:
            for table, keys in self._keys(kind):
                by_key = table.get(kind.resource, {})
                for key in keys:
                    members = by_key.get(key)
                    if members is not None:
                        members.discard(conn)
                        if not members:
                            del by_key[key]
                if not by_key:
                    table.pop(kind.resource, None)

    def matching(
        self, resource: str, sub_resources: Iterable[str], changed_resource_id: str
    ) -> Iterable[Subscriber]:
        """Each connection registered for an item of `resource` with `sub_resources` and
        `changed_resource_id`, once: often the index's own set (iterate it before the routes
        change, not after)."""
        sets: list[set[Subscriber]] = []
        by_sub = self._by_sub.get(resource)
        if by_sub:
            sets.extend(by_sub[s] for s in sub_resources if s in by_sub)
            if WILDCARD in by_sub:
                sets.append(by_sub[WILDCARD])
        by_id = self._by_id.get(resource)
        by_prefix = self._by_prefix.get(resource)
        if by_id or by_prefix:
            found: list[set[Subscriber]] = []
            if by_id and changed_resource_id in by_id:
                found.append(by_id[changed_resource_id])
            if by_prefix:
                found.extend(
                    by_prefix[p] for p in prefixes_of(changed_resource_id) if p in by_prefix
                )
            if found:
                sets.append(
                    {c for c in chain(*found) if c.kinds[resource].matches(sub_resources)}
                )
        if len(sets) == 1:
            return sets[0]
        if sets:
            return set().union(*sets)
        return ()


__all__ = ["Routes", "Subscriber", "Table", "Transport"]
