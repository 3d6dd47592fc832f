"""Background work that must go on while the service serves: trimming, advertising, expiring
tokens, pinging listeners. Each loops forever and handles Redis's failures itself; a task that
ends anyway (a bug of ours or a library's: an error no handler expected, or a loop that returned)
would stop that work silently while the publisher goes on answering `/readyz`. `supervise`
says so loudly (the traceback, at error), counts it (`changefeed_background_restarts_total`) and
starts the work again after a backoff that grows while it keeps failing (`changefeed.backoff`,
with jitter, as the tail's and the listener's).

    >>> tasks = [asyncio.create_task(supervise("trim", trim_forever, restarts))]
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import structlog

from changefeed.backoff import Backoff

log = structlog.get_logger(__name__)

BACKOFF = Backoff(initial=0.1, maximum=10.0)
"""The delays before each restart of a task that keeps failing."""
STEADY = 60.0
"""A task that ran this many seconds before it failed starts its backoff over."""


async def supervise(
    name: str, work: Callable[[], Awaitable[None]], restarts: Counter[str]
) -> None:
    """Run `work()` until cancelled, starting it again whenever it returns or fails."""
    delays = BACKOFF.delays()
    while True:
        started = time.monotonic()
        try:
            await work()
            log.error("background task ended; starting it again", task=name)
        except Exception:
            log.exception("background task failed; starting it again", task=name)
        restarts[name] += 1
        if time.monotonic() - started >= STEADY:
            delays = BACKOFF.delays()
        await asyncio.sleep(next(delays))


__all__ = ["BACKOFF", "supervise"]
