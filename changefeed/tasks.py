"""Stopping background tasks: wait for a task to end, its cancellation ending there, its
waiter's own cancellation going on up.

`contextlib.suppress(asyncio.CancelledError)` around `await task` cannot tell the two apart: it
also swallows the CancelledError meant for the task that waits (cancelled while it waited), which
then goes on as if nothing had asked it to stop.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def wait_ended(*tasks: asyncio.Future[Any]) -> None:
    """Wait until each of `tasks` has ended. A task's own cancellation ends here; a task's other
    exception is raised (the first met, in the order given); the caller's cancellation (it was
    cancelled while it waited) is raised as soon as it comes, the other tasks left as they are."""
    for task in tasks:
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel each of `tasks`, then wait until each has ended (`wait_ended`)."""
    for task in tasks:
        task.cancel()
    await wait_ended(*tasks)
