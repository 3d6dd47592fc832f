"""Waiting for the window to advance: long polls and catching-up connections share one event,
no Redis connection or buffer per waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


class Waiters:
    """One event set each time the window advances (or is reset), and who waits on it."""

    def __init__(self) -> None:
        self._advanced = asyncio.Event()
        self.waiting = 0
        """Long polls waiting now (a gauge for stats and metrics)."""
        self.waits = 0
        """Waits begun since start: a poll that woke, found nothing for it and waits again
        counts twice."""
        self.released = False
        """Shutting down: every wait returns at once."""

    def wake(self) -> None:
        """The window advanced: every waiter looks again."""
        self._advanced.set()
        self._advanced = asyncio.Event()

    def release(self) -> None:
        """Shutting down: every wait() returns now, and later ones at once."""
        self.released = True
        self.wake()

    async def advanced(self) -> None:
        """Until the next `wake`."""
        await self._advanced.wait()

    async def wait(
        self, done: Callable[[], bool], still: Callable[[], bool], timeout: float
    ) -> bool:
        """Wait until `done()` or not `still()` (the epoch changed), at most `timeout` seconds;
        True when it did, False on time-out or shutdown."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self.waits += 1
        self.waiting += 1
        try:
            while not done() and still():
                remaining = deadline - loop.time()
                if self.released or remaining <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):  # wait_for could lose a cancel
                        await self._advanced.wait()
            return True
        finally:
            self.waiting -= 1


__all__ = ["Waiters"]
