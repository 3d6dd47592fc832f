"""The query parameters each route takes, and the one check of a request's query against them.

A handler declares what it takes with `takes(...)` (it marks the handler, as `requires` does: no
wrapper, so a websocket's handler holds no extra frame); the publisher's middleware
(publisher.web.edge) calls `refusal(request)` before every handler. A route that declares
nothing takes no parameter. An unknown parameter, or one that may not repeat given twice, is a
400 in the route's usual JSON error (`{"code", "message"}`, the code the route declares), naming
the parameter and the ones the route knows. `problem` is the pure check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web

from publisher.web.http import json_error

_TAKES = "__changefeed_takes__"
H = TypeVar("H", bound=Callable[..., object])


@dataclass(frozen=True, slots=True)
class Takes:
    """The query parameters of a route: those given at most once, and those that may repeat."""

    single: frozenset[str] = frozenset()
    repeated: frozenset[str] = frozenset()
    numbered: frozenset[str] = frozenset()
    """Families of single parameters named by a number: `cursor` for `cursor0`, `cursor1`..."""
    code: str = "InvalidQuery"
    """The JSON `code` of the route's 400 for a bad query."""
    answer: Callable[[str], web.Response] | None = None
    """The route's own error answer for a message, when it is not `{"code", "message"}`."""

    def knows(self, name: str) -> bool:
        if name in self.single or name in self.repeated:
            return True
        family = name.rstrip("0123456789")
        return family != name and family in self.numbered and name[len(family):].isascii()

    @property
    def known(self) -> str:
        names = sorted(self.single | self.repeated) + [f"{n}0, {n}1..." for n in self.numbered]
        return ", ".join(names) if names else "none"


NOTHING = Takes()
"""What a route takes that declares nothing."""


def problem(names: Iterable[str], takes: Takes) -> str | None:
    """What is wrong with a query whose parameter names are `names` (in order, repeated as
    given) for a route that takes `takes`: None when nothing is (pure)."""
    counts = Counter(names)
    unknown = sorted(name for name in counts if not takes.knows(name))
    if unknown:
        listed = ", ".join(repr(name) for name in unknown)
        return f"unknown parameter(s) {listed} (known: {takes.known})"
    twice = sorted(name for name, n in counts.items() if n > 1 and name not in takes.repeated)
    if twice:
        return f"parameter(s) {', '.join(repr(n) for n in twice)} may be given only once"
    return None


def takes(
    *single: str, repeated: Iterable[str] = (), numbered: Iterable[str] = (),
    code: str = "InvalidQuery", answer: Callable[[str], web.Response] | None = None,
) -> Callable[[H], H]:
    """Declare the query parameters of a handler (`single` at most once each, `repeated` any
    number of times, `numbered` families) and its 400's code (or its own `answer`)."""
    declared = Takes(frozenset(single), frozenset(repeated), frozenset(numbered), code, answer)

    def mark(handler: H) -> H:
        setattr(handler, _TAKES, declared)
        return handler

    return mark


def takes_of(handler: object) -> Takes:
    """What `handler` declared (`takes`), or `NOTHING`."""
    declared = getattr(handler, _TAKES, NOTHING)
    assert isinstance(declared, Takes)
    return declared


def refusal(request: web.Request) -> web.Response | None:
    """The 400 answering `request` when its query does not fit its route; None when it fits (or
    no route matched: aiohttp answers that 404 or 405 itself)."""
    if request.match_info.http_exception is not None or not request.query:
        return None
    declared = takes_of(request.match_info.handler)
    wrong = problem((name for name, _ in request.query.items()), declared)
    if wrong is None:
        return None
    if declared.answer is not None:
        return declared.answer(wrong)
    return json_error(400, declared.code, wrong)


__all__ = ["NOTHING", "Takes", "problem", "refusal", "takes", "takes_of"]
