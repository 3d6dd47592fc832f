"""changefeed.tasks: a stopped task's cancellation ends at its waiter, the waiter's own does not."""

from __future__ import annotations

import asyncio

import pytest

from changefeed.tasks import cancel_and_wait, wait_ended


async def test_a_cancelled_task_is_waited_for_and_its_cancellation_ends_there() -> None:
    task = asyncio.create_task(asyncio.sleep(60))
    await cancel_and_wait(task)
    assert task.cancelled()


async def test_the_waiters_own_cancellation_reaches_it_while_a_task_is_slow_to_stop() -> None:
    stopping = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            stopping.set()
            await asyncio.sleep(0.5)  # its clean-up outlasts the waiter's patience

    task = asyncio.create_task(slow_to_stop())
    await asyncio.sleep(0)
    waiter = asyncio.create_task(cancel_and_wait(task))
    await stopping.wait()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert waiter.cancelled()
    await wait_ended(task)  # the task itself still ends, cancelled
    assert task.cancelled()


async def test_a_tasks_own_error_is_raised_and_the_tasks_before_it_have_ended() -> None:
    async def fails() -> None:
        raise RuntimeError("broken")

    first = asyncio.create_task(asyncio.sleep(60))
    second = asyncio.create_task(fails())
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(RuntimeError, match="broken"):
        await wait_ended(first, second)
    assert first.cancelled()


async def test_a_task_that_ended_on_its_own_is_simply_waited_for() -> None:
    task = asyncio.create_task(asyncio.sleep(0))
    await asyncio.sleep(0.01)
    await cancel_and_wait(task)
    assert task.done() and not task.cancelled()
