"""The long-poll waiters (publisher.delivery.waiters): a wait ends on a wake, a time-out or a
release, and a cancellation that meets a wake-up is never lost (pure asyncio, no Redis)."""

from __future__ import annotations

import asyncio

import pytest

from publisher.delivery.waiters import Waiters


async def test_a_cancel_in_the_same_turn_as_a_wake_ends_the_wait() -> None:
    """`asyncio.wait_for` on Python 3.11 returns the event's result and drops a cancellation that
    arrives in the same loop turns as the wake-up: the waiter then waited on, and a stopping
    publisher's long poll with it (the outbox relay's lost stop was this race)."""
    for _ in range(20):
        waiters = Waiters()
        task = asyncio.create_task(waiters.wait(lambda: False, lambda: True, 30))
        for _ in range(3):
            await asyncio.sleep(0)  # the task waits on the event now
        waiters.wake()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)
        assert waiters.waiting == 0


async def test_a_wait_ends_on_a_time_out_and_on_a_release() -> None:
    waiters = Waiters()
    assert await waiters.wait(lambda: False, lambda: True, 0.05) is False
    task = asyncio.create_task(waiters.wait(lambda: False, lambda: True, 30))
    await asyncio.sleep(0)
    waiters.release()
    assert await asyncio.wait_for(task, 5) is False
