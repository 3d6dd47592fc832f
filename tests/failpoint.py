"""Failpoints: the next call of a real method raises an error of the test's choosing; every later
call runs the method itself (etcd's gofail, for the async methods of this code)."""

from __future__ import annotations

from typing import Any

import pytest


class FailOnce:
    """`FailOnce(monkeypatch, Shard, "tail", RuntimeError(...))`: the next call of `Shard.tail`,
    on any instance, raises the error; `fired` says whether it has."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: type, name: str,
                 error: BaseException) -> None:
        self.fired = False
        real = getattr(owner, name)

        async def failing(this: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.fired:
                self.fired = True
                raise error
            return await real(this, *args, **kwargs)

        monkeypatch.setattr(owner, name, failing)


__all__ = ["FailOnce"]
