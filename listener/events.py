"""What a listener delivers to the application, in order.

For each connection that could not resume: an optional `Resync`, then per resource
`BootstrapStart`, `BootstrapRecords` (one per page), `BootstrapDone`; then `ChangeEvent`s, the
buffered ones first, then live ones. A resumed connection delivers only `ChangeEvent`s.

A `ChangeEvent` is a change *delivered*; the change a service *commits* is the bucket's
`publisher.Change`. `Change` here is the event's older name, kept (and exported by `listener`)
for the code that uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from changefeed.protocol import ChangeItem


@dataclass(frozen=True, slots=True)
class Resync:
    """The listener could not resume: drop the whole local view; a bootstrap follows."""

    reason: str


@dataclass(frozen=True, slots=True)
class BootstrapStart:
    """A full copy of `resource` follows: start a fresh view of it (it replaces the old one)."""

    resource: str


@dataclass(frozen=True, slots=True)
class BootstrapRecords:
    """One page of the bootstrap route of `resource`: the objects as the publisher serves them."""

    resource: str
    objects: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class BootstrapDone:
    """Every object of `resource` was delivered: the fresh view replaces the old one.

    `cursor` is set on the last BootstrapDone of a bootstrap: the position the view now reflects,
    to store with the view if the application keeps it across restarts (None on earlier ones).
    """

    resource: str
    cursor: str | None = None


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """Something about `item.changed_resource_id` changed: fetch it again (or drop it if gone)."""

    item: ChangeItem

    @property
    def resource(self) -> str:
        return self.item.resource

    @property
    def id(self) -> str:
        return self.item.changed_resource_id

    @property
    def sub_resources(self) -> tuple[str, ...]:
        return self.item.sub_resources

    @property
    def cursor(self) -> str:
        """The item's cursor: once handled, the listener resumes after it (for a coalesced
        item: only after the last of its catch-up, `caught_up`)."""
        return self.item.cursor

    @property
    def coalesced(self) -> bool:
        """True when it stands for every change of its id while the listener was behind
        (`Listener(coalesce=True)`): its sub-resources are merged, its cursor the newest."""
        return self.item.coalesced

    @property
    def caught_up(self) -> bool:
        """The last coalesced item of a catch-up: live changes follow."""
        return self.item.caught_up


Change = ChangeEvent
"""The older name of `ChangeEvent` (what `listener` exports)."""

Event = Resync | BootstrapStart | BootstrapRecords | BootstrapDone | ChangeEvent
"""Every event a listener delivers."""
