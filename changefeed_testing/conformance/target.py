"""The publisher under test, as every check sees it, and the registry of checks.

A check is a small coroutine `check(target) -> str`: it returns what it observed when the
publisher behaved as docs/protocol.md says, raises `Failed` when not, and `NotRun` when it cannot
judge this target (no way to cause a change, no cursors...). Each opens its own websockets, so
one check's failure never spoils the next.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from changefeed_testing.conformance.changes import ChangeMaker
from changefeed_testing.conformance.outcome import Failed, NotRun


def base_url(url: str) -> str:
    """`http://host:port` from what a user may type: http(s)://, ws(s)://, with or without
    `/changefeeds` and a trailing slash."""
    url = url.strip().rstrip("/")
    url = url.removesuffix("/changefeeds")
    if url.startswith("ws://"):
        url = "http://" + url[len("ws://") :]
    elif url.startswith("wss://"):
        url = "https://" + url[len("wss://") :]
    elif not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url


@dataclass
class Target:
    """A publisher at `url` (its base URL) and the resource the checks register for."""

    url: str
    resource: str = "vm"
    timeout: float = 5.0
    """Seconds to wait for any one answer (a reply, an item, a close)."""
    wait: float = 5.0
    """Without a change maker: seconds to wait for an item to arrive by itself."""
    changes: ChangeMaker | None = None
    resources: dict[str, list[str]] | None = None
    """Resource -> sub-resources, from GET /changefeeds (the `resources` check fills it)."""
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    probes: list[str] = field(default_factory=list)
    """The ids of the changes the checks caused, in order (they are in the live bucket)."""
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.url = base_url(self.url)

    def learn_resources(self, resources: dict[str, list[str]]) -> None:
        """Keep the resources GET /changefeeds answered (the `resources` check)."""
        self.resources = resources

    @property
    def ws_url(self) -> str:
        scheme, rest = self.url.split("://", 1)
        return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/changefeeds"

    @property
    def instance(self) -> str:
        return f"conformance-{self.run}"

    @property
    def id_prefix(self) -> str:
        """Every changedResourceId this run commits starts with it."""
        return f"conformance-{self.run}-"

    def new_id(self) -> str:
        return f"{self.id_prefix}{next(self._ids)}"

    def subs(self) -> list[str]:
        """The resource's sub-resources, as GET /changefeeds listed them."""
        if self.resources is None:
            raise NotRun("the publisher's resources are unknown (GET /changefeeds failed)")
        if self.resource not in self.resources:
            raise NotRun(f"the publisher does not serve {self.resource!r} (try --resource)")
        subs = self.resources[self.resource]
        if not subs:
            raise NotRun(f"{self.resource!r} has no sub-resources")
        return subs

    def other_resource(self) -> str | None:
        """Another resource of the publisher (for a v2 registration of two), if it has one."""
        others = [r for r in self.resources or {} if r != self.resource]
        return others[0] if others else None

    def v1(self, subs: list[str] | None = None, **extra: Any) -> dict[str, Any]:
        """A v1 registration for the resource (all its sub-resources by default)."""
        kind = {"resource": self.resource, "subResources": subs or self.subs()}
        return {"instance": self.instance, "service": "conformance", "changeKind": kind, **extra}

    def v2(self, kinds: dict[str, list[str]], **extra: Any) -> dict[str, Any]:
        listed = [{"resource": r, "subResources": s} for r, s in kinds.items()]
        return {"instance": self.instance, "service": "conformance", "resources": listed, **extra}

    async def change(self, id: str, sub: str) -> str | None:
        """Cause a change item of the resource; its cursor when the change maker knows it."""
        if self.changes is None:
            raise NotRun("no way to cause a change: pass --config or --publish-command")
        self.probes.append(id)
        return await self.changes.make(self.resource, id, sub)


CheckFunction = Callable[[Target], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    group: str
    what: str
    """What it verifies, one line (shown by --list)."""
    run: CheckFunction


CHECKS: list[Check] = []
"""Every check, in the order they run (the modules register theirs when imported)."""


def check(name: str, group: str, what: str) -> Callable[[CheckFunction], CheckFunction]:
    """Register a check."""

    def register(function: CheckFunction) -> CheckFunction:
        CHECKS.append(Check(name, group, what, function))
        return function

    return register


def expect(condition: bool, problem: str) -> None:
    """Fail the check with `problem` unless `condition` holds."""
    if not condition:
        raise Failed(problem)
