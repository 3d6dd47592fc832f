"""Stopping the capture ends it promptly whatever PostgreSQL does: its session's thread
blocked in a statement on a backend that does not answer (SIGSTOPped) is freed by shutting
the session's connections down."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg2
import pytest

from changefeed.protocol import Resource
from publisher.bucket import ChangeBucket, connect
from publisher.capture.runner import STOP_GRACE, CaptureRunner
from publisher.config.capture import parse_capture
from publisher.config.settings import Config
from tests.conftest import PublisherFactory
from tests.publisher.capture.rig import capture_section, prepare, section_of
from tests.servers import RedisServer, eventually, scaled

RESOURCES = [Resource("vm", ("nic", "alias", "state"), "/vms")]
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


async def test_a_stop_whose_caller_is_cancelled_lets_the_cancellation_through(
    redis_server: RedisServer,
) -> None:
    """`stop` waits for the capture's task, whose cancellation it swallows; a cancellation of
    its caller meanwhile is the caller's, and reaches it (a TaskGroup shutting down, a
    timeout). The session hangs in its connect to a server that never answers."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    url = f"postgresql://changefeed@127.0.0.1:{silent.getsockname()[1]}/vmapi"
    capture = parse_capture({"capture": capture_section(url)}, {"vm": ["nic", "alias", "state"]},
                            "test", Path.cwd())
    assert capture is not None
    bucket = ChangeBucket(connect(redis_server.url), "test", RESOURCES)
    runner = CaptureRunner(bucket, capture, {r.resource: r for r in RESOURCES}, url, "t")
    try:
        runner.start()
        await eventually(lambda: in_function("changefeed-capture", "connect"),
                         "the session connects")
        caller = asyncio.create_task(runner.stop())
        await asyncio.sleep(0.1)  # the stop waits for the session's grace
        assert not caller.done()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert caller.cancelled()
        await runner.stop()  # a stop not cancelled ends quietly
    finally:
        await bucket.aclose()
        silent.close()
