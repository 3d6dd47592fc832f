"""Failpoints: the next call of a real method raises an error of the test's choosing, or waits
until the test lets it go; every later call runs the method itself (etcd's gofail, for the async
methods of this code)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest


class _Once:
    """Patches `owner.name`: its next call, on any instance, first runs `_first` (which may
    raise); every call then runs the method itself. `fired` says whether the next call came."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: type, name: str) -> None:
        self.fired = False
        real = getattr(owner, name)

        async def patched(this: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.fired:
                self.fired = True
                await self._first()
            return await real(this, *args, **kwargs)

        monkeypatch.setattr(owner, name, patched)

    async def _first(self) -> None:
        raise NotImplementedError


class FailOnce(_Once):
    """`FailOnce(monkeypatch, Shard, "tail", RuntimeError(...))`: the next call of `Shard.tail`,
    on any instance, raises the error; `fired` says whether it has."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: type, name: str,
                 error: BaseException) -> None:
        self.error = error
        super().__init__(monkeypatch, owner, name)

    async def _first(self) -> None:
        raise self.error


class HoldOnce(_Once):
    """`HoldOnce(monkeypatch, Shard, "tail")`: the next call of `Shard.tail`, on any instance,
    waits until `release()` before it runs (a read whose answer comes late: a partition);
    `reached` is set when that call has begun."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: type, name: str) -> None:
        self.reached = asyncio.Event()
        self._released = asyncio.Event()
        super().__init__(monkeypatch, owner, name)

    async def _first(self) -> None:
        self.reached.set()
        await self._released.wait()

    def release(self) -> None:
        self._released.set()


class ThenOnce:
    """`ThenOnce(monkeypatch, ChangeBucket, "retentions", action)`: the next call of the method,
    on any instance, runs it and then awaits `action()` before it returns (the world changes
    between a path's reads: a new epoch just after the path read the old one); every later call
    runs the method alone. `fired` says whether the next call came."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: type, name: str,
                 action: Callable[[], Awaitable[object]]) -> None:
        self.fired = False
        real = getattr(owner, name)

        async def patched(this: Any, *args: Any, **kwargs: Any) -> Any:
            result = await real(this, *args, **kwargs)
            if not self.fired:
                self.fired = True
                await action()
            return result

        monkeypatch.setattr(owner, name, patched)


__all__ = ["FailOnce", "HoldOnce", "ThenOnce"]
