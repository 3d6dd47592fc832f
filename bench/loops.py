"""The event loop of a baseline server: the one the publisher of the same run uses (uvloop when
it does), so that a ratio compares the servers, not their loops."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Coroutine
from typing import Any

LOOPS = ("uvloop", "asyncio")


def choose(loop: str | None) -> str:
    """The loop `changefeed serve --loop loop` runs on (None and "auto": uvloop when
    installed)."""
    if loop in LOOPS:
        return loop
    return "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"


def running() -> str:
    """The name of the running loop's package: "uvloop" or "asyncio"."""
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


def run(main: Coroutine[Any, Any, None], loop: str) -> None:
    """Run `main` to completion on `loop`."""
    factory = None
    if loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)
