"""Stopping the capture ends it promptly whatever PostgreSQL does: its session's thread
blocked in a statement on a backend that does not answer (SIGSTOPped) is freed by shutting
the session's connections down."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import psycopg2

from publisher.capture.runner import STOP_GRACE, CaptureRunner
from publisher.config.settings import Config
from tests.conftest import PublisherFactory
from tests.publisher.capture.rig import prepare, section_of
from tests.servers import RedisServer, eventually, scaled

LOCK_BACKEND = """
SELECT DISTINCT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
WHERE a.application_name LIKE 'changefeed-capture %' AND a.backend_type = 'client backend'
  AND a.datname = current_database() AND l.locktype = 'advisory' AND l.granted
"""
"""The capture's lock connection: the one of its backends in this test's database that holds
its advisory lock (while it copies, the capture has another connection open beside it)."""


def in_function(name: str, function: str) -> bool:
    """A thread whose name starts with `name` runs `function` (somewhere in its stack)."""
    frames = sys._current_frames()
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or 0) if thread.name.startswith(name) else None
        while frame is not None:
            if frame.f_code.co_name == function:
                return True
            frame = frame.f_back
    return False


async def stop_taking(runner: CaptureRunner, seconds: float, resume: Callable[[], None]) -> float:
    """Stop `runner`, failing when that takes longer than `seconds` (scaled; then `resume()`
    lets it end); the time it took."""
    started = time.monotonic()
    stopping = asyncio.create_task(runner.stop())
    done, _ = await asyncio.wait({stopping}, timeout=scaled(seconds))
    if not done:
        resume()
        await stopping
        raise AssertionError(f"the capture did not stop within {scaled(seconds)} s")
    await stopping
    return time.monotonic() - started


async def test_the_capture_stops_while_its_backend_does_not_answer(
    database: str, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    capture = prepare(database)
    config = make_config(redis_server.url, capture=section_of(capture, database))
    async with start_publisher(config) as service:
        runner = service.capture
        assert runner is not None
        await eventually(lambda: runner.stats.streaming, "the capture streams", within=30)
        conn = psycopg2.connect(database)
        try:
            with conn.cursor() as cur:
                cur.execute(LOCK_BACKEND)
                ((pid,),) = cur.fetchall()
        finally:
            conn.close()
        os.kill(pid, signal.SIGSTOP)
        try:  # the session reads its lag every statusInterval: on that backend
            await eventually(lambda: in_function("changefeed-capture", "_lag"),
                             "the session waits on the paused backend")
            took = await stop_taking(runner, 4 * STOP_GRACE, lambda: os.kill(pid, signal.SIGCONT))
        finally:
            os.kill(pid, signal.SIGCONT)
        assert took < scaled(3 * STOP_GRACE), took
