"""Watches: narrowing a subscription to exact ids and to id prefixes (the State Watch pattern).

Ids are hierarchical, `/`-separated. A prefix watch on ``servers`` sees ``servers`` itself,
``servers/1`` and ``servers/1/nic``, never ``serversX``: a prefix matches whole path segments. A
watch with neither ids nor prefixes sees every id. Pure code, shared by every transport (the
websocket registration, the `events` long-poll and the listener's pull consumer).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

MAX_WATCHED = 1000
"""Most ids plus prefixes one watch may name."""
MAX_ID_BYTES = 512
"""Longest changedResourceId (and so watched id or prefix), in UTF-8 bytes: the one definition
the publisher's commits and bootstrap markers check too."""


@dataclass(frozen=True, slots=True)
class Watch:
    """Exact ids and id prefixes; empty means every id."""

    ids: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    _starts: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_starts", tuple(p + "/" for p in self.prefixes))

    @property
    def everything(self) -> bool:
        return not self.ids and not self.prefixes

    def matches(self, id: str) -> bool:
        if not self.ids and not self.prefixes:
            return True
        return id in self.ids or id in self.prefixes or id.startswith(self._starts)

    def to_wire(self) -> dict[str, list[str]]:
        """`{"ids": [...], "prefixes": [...]}`, leaving out what is empty."""
        wire: dict[str, list[str]] = {}
        if self.ids:
            wire["ids"] = sorted(self.ids)
        if self.prefixes:
            wire["prefixes"] = list(self.prefixes)
        return wire

    def to_query(self) -> list[tuple[str, str]]:
        """The query parameters of a bootstrap page narrowed by this watch: repeated `id` and
        `prefix` (docs/http.md); none for every id."""
        return [("id", id) for id in sorted(self.ids)] + [("prefix", p) for p in self.prefixes]

    @classmethod
    def of(cls, ids: Iterable[str] = (), prefixes: Iterable[str] = ()) -> Watch:
        """A watch from trusted values; prefixes lose trailing `/`s, duplicates are dropped."""
        return cls(frozenset(ids), tuple(dict.fromkeys(p.rstrip("/") for p in prefixes)))


def prefixes_of(id: str) -> Iterator[str]:
    """Every prefix whose watch sees `id`: its `/`-separated ancestors, then `id` itself.

    ``servers/1/nic`` gives ``servers``, ``servers/1``, ``servers/1/nic``; an index of prefix
    watches is looked up with these (the State Watch pattern's walk up the hierarchy).
    """
    start = id.find("/")
    while start != -1:
        yield id[:start]
        start = id.find("/", start + 1)
    yield id


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, list):
        raise ValueError(f"{where} must be a list of strings")
    for item in value:
        if not isinstance(item, str) or not item:
            raise ValueError(f"{where} must hold non-empty strings, not {item!r:.60}")
        if len(item.encode()) > MAX_ID_BYTES:
            raise ValueError(f"{where} holds an id longer than {MAX_ID_BYTES} bytes")
    return value


def parse_watch(
    ids: Any, prefixes: Any, where: str = "", *, names: tuple[str, str] = ("ids", "prefixes")
) -> Watch:
    """A watch from untrusted input (JSON values: lists of strings, or None).

    Raises ValueError with a message naming `where` (e.g. ``resources[0].``), the field (`names`:
    how the caller's input calls the ids and the prefixes) and the fault.
    """
    ids_name, prefixes_name = f"{where}{names[0]}", f"{where}{names[1]}"
    id_list = _strings(ids, ids_name)
    prefix_list = _strings(prefixes, prefixes_name)
    for prefix in prefix_list:
        if not prefix.strip("/"):
            raise ValueError(f"{prefixes_name} must not hold an empty prefix ({prefix!r})")
    if len(id_list) + len(prefix_list) > MAX_WATCHED:
        raise ValueError(
            f"{ids_name} and {prefixes_name} name more than {MAX_WATCHED} entries together"
        )
    if not id_list and not prefix_list:
        return EVERYTHING  # one object for the common case, not one per registration
    return Watch.of(id_list, prefix_list)


EVERYTHING = Watch()

__all__ = ["EVERYTHING", "MAX_WATCHED", "Watch", "parse_watch", "prefixes_of"]
