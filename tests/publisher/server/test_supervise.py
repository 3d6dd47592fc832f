"""Background work goes on: a task that fails with an error no handler expected, or returns, is
logged with its traceback, counted and started again (publisher.server.supervise)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable

import pytest
from structlog.testing import capture_logs

from publisher.bucket import Log
from publisher.config.settings import Config
from publisher.server.supervise import supervise
from tests.conftest import PublisherFactory
from tests.failpoint import FailOnce
from tests.publisher.web.test_metrics import scrape
from tests.servers import RedisServer, eventually


async def test_a_task_that_fails_or_returns_is_started_again_and_counted() -> None:
    runs: list[str] = []
    forever = asyncio.Event()

    async def work() -> None:
        runs.append("run")
        if len(runs) == 1:
            raise RuntimeError("a bug")
        if len(runs) == 2:
            return  # a loop that ended
        await forever.wait()

    restarts: Counter[str] = Counter()
    with capture_logs() as logs:
        task = asyncio.create_task(supervise("trim", work, restarts))
        await eventually(lambda: len(runs) == 3, "started a third time", within=5)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert restarts == Counter(trim=2)
    assert [(e["event"], e["log_level"], bool(e.get("exc_info"))) for e in logs
            if e["event"].startswith("background task")] == [
        ("background task failed; starting it again", "error", True),
        ("background task ended; starting it again", "error", False),
    ]


async def test_trimming_goes_on_after_an_unexpected_error(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failpoint: the publisher's next trim raises what is not a Redis error. Before, the trim
    task ended and the log was never trimmed again, silently."""
    failpoint = FailOnce(monkeypatch, Log, "trim", RuntimeError("a bug of the trim"))
    config = make_config(redis_server.url, maxAge=0.3, gcInterval=0.1)
    async with start_publisher(config) as service:
        await eventually(lambda: failpoint.fired, "the failpoint fired")
        await service.bucket.publish("vm", "a", ["nic"])

        async def trimmed() -> bool:
            return (await service.bucket.log.retention()).oldest is None

        for _ in range(100):
            if await trimmed():
                break
            await asyncio.sleep(0.05)
        assert await trimmed(), "trimmed after the failure"
        samples, _, _ = await scrape(service)
        assert samples["changefeed_background_restarts_total", (("task", "trim"),)] == 1
        assert samples["changefeed_background_restarts_total", (("task", "ping"),)] == 0
