"""`changefeed serve --workers 2`: two publisher processes on one port, supervised.

Connections land on both workers; a SIGKILLed worker is restarted and a listener that was on it
resumes with nothing lost (the oracle of faults/oracle.py); SIGTERM drains both and the parent exits
0. `Restarts`, the restart policy, is pure and tested without processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from faults.harness import QUICK, Rig
from publisher.server.workers import Restarts
from tests.servers import PublisherProcess, scaled, write_config


def test_a_worker_that_ran_long_is_restarted_at_once() -> None:
    restarts = Restarts()
    assert restarts.exited(60.0) == 0.0


def test_a_worker_dying_young_waits_longer_each_time_then_the_parent_gives_up() -> None:
    restarts = Restarts()
    delays = [restarts.exited(0.5) for _ in range(restarts.give_up - 1)]
    waits = [d for d in delays if d is not None]
    assert waits == sorted(waits) and len(waits) == len(delays)
    assert waits[0] == restarts.backoff.initial and waits[-1] > waits[0]
    assert restarts.exited(0.5) is None
    assert Restarts().exited(0.5) == restarts.backoff.initial  # a new slot starts over


async def _get(url: str) -> Any:
    """One GET on a connection of its own (so the kernel picks a worker for it)."""
    connector = aiohttp.TCPConnector(force_close=True)
    timeout = aiohttp.ClientTimeout(total=scaled(5))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(url, timeout=timeout) as response,
    ):
        assert response.status == 200, await response.text()
        return await response.json()


def _pid(publisher_id: str) -> int:
    """The process id in a publisher id (`<host>-<pid>-<hex>`)."""
    return int(publisher_id.rsplit("-", 2)[1])


def _records(output: str) -> list[dict[str, Any]]:
    """Every JSON log record in `output`. The workers share the parent's stdout, so two of them
    may write into one line: each `{...}` object is taken wherever it stands (log records hold
    no nested objects)."""
    records = []
    for text in re.findall(r"\{[^{}]*\}", output):
        try:
            record = orjson.loads(text)
        except orjson.JSONDecodeError:
            continue  # a record cut by another process's write
        if isinstance(record, dict) and "event" in record:
            records.append(record)
    return records


def _running(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (an exited one not yet reaped by its
    new parent is a zombie: state Z)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def _until(predicate: Any, what: str, within: float = 15) -> Any:
    deadline = time.monotonic() + scaled(within)
    while True:
        found = await predicate()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.1)  # other processes' state: nothing to wait on here


@pytest.mark.timeout(120)
async def test_two_workers_share_the_port_survive_a_kill_and_drain_on_sigterm(
    tmp_path: Path,
) -> None:
    async with Rig(tmp_path) as rig:
        redis = await rig.redis(persist=False)
        config = write_config(tmp_path / "config.js", redis.url,
                              server={"host": "127.0.0.1", "port": 0},
                              fleet={"interval": 0.2, "ttl": 1})
        parent = PublisherProcess(config, "--workers", "2")
        await asyncio.to_thread(parent.start)
        rig.stack.callback(parent.stop)
        stats = parent.url + "/changefeeds/stats"

        async def both_advertised() -> set[str] | None:
            body = await _get(stats + "?scope=fleet")
            ids = {p["publisher"] for p in body["publishers"]}
            return ids if len(ids) == 2 else None

        workers = await _until(both_advertised, "both workers advertise")
        seen: set[str] = set()
        for _ in range(64):
            seen.add((await _get(stats))["publisher"])
            if seen == workers:
                break
        assert seen == workers, f"every connection landed on {seen}"

        listener = await rig.listener("a", parent.ws_url)
        await listener.bootstrapped()
        writer = await rig.writer(config, QUICK)
        for _ in range(20):
            await writer.commit()

        async def serving_a() -> str | None:
            body = await _get(stats + "?scope=fleet")
            on = [r["publisher"] for r in body.get("registrations", [])
                  if r["instance"] == "a-instance"]
            return on[0] if on else None

        victim = await _until(serving_a, "the listener's worker is in the fleet stats")
        os.kill(_pid(victim), signal.SIGKILL)
        for _ in range(20):
            await writer.commit()
            await asyncio.sleep(0.02)

        async def replaced() -> set[str] | None:
            body = await _get(stats + "?scope=fleet")
            ids = {p["publisher"] for p in body["publishers"]} - {victim}
            return ids if len(ids) == 2 else None

        now = await _until(replaced, "the supervisor restarted the killed worker")
        assert "worker exited: restarting it" in parent.output()
        for _ in range(10):
            await writer.commit()
        assert await rig.settle() == []
        verdict = rig.history.verdict()
        assert not verdict.problems(), verdict.problems()
        assert verdict.total.lost == 0 and verdict.total.received > 0

        assert parent.process is not None
        parent.process.terminate()
        try:
            code = await asyncio.to_thread(parent.process.wait, scaled(20))
        except subprocess.TimeoutExpired:
            pytest.fail("the parent did not exit within 20 s of SIGTERM:\n" + parent.output())
        assert code == 0, parent.output()
        for publisher_id in now:
            with pytest.raises(ProcessLookupError):
                os.kill(_pid(publisher_id), 0)
        assert parent.output().count("shutting down") >= 2


@pytest.mark.timeout(60)
async def test_workers_on_the_embedded_redis_stop_when_their_parent_is_sigkilled() -> None:
    """No supervisor, no workers: a SIGKILLed parent's workers see their parent pid change, send
    themselves SIGTERM, drain and exit, so nothing keeps serving the port unsupervised. The
    workers say which Redis their parent gave them (the embedded one here), not "configured"."""
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="cfw") as short:
        directory = Path(short)
        config = write_config(directory / "config.js", None, stateDir=str(directory / "state"),
                              server={"host": "127.0.0.1", "port": 0},
                              fleet={"interval": 0.2, "ttl": 1})
        parent = PublisherProcess(config, "--workers", "2")
        await asyncio.to_thread(parent.start)
        redis_pid: int | None = None
        try:
            stats = parent.url + "/changefeeds/stats?scope=fleet"

            async def both_advertised() -> set[str] | None:
                ids = {p["publisher"] for p in (await _get(stats))["publishers"]}
                return ids if len(ids) == 2 else None

            ids = await _until(both_advertised, "both workers advertise")
            workers = {_pid(p) for p in ids}

            async def logged() -> list[dict[str, Any]] | None:
                records = _records(parent.output())
                listening = [r for r in records if r["event"] == "listening"]
                return records if len(listening) == 2 else None

            records = await _until(logged, "both workers log that they listen")
            redis_pid = next(int(r["pid"]) for r in records
                             if r["event"] == "embedded redis started")
            kinds = [r["redis_kind"] for r in records if r["event"] == "listening"]
            assert all(k.startswith("embedded") for k in kinds), kinds

            assert parent.process is not None
            parent.process.kill()
            await asyncio.to_thread(parent.process.wait, scaled(10))

            async def all_gone() -> bool:
                return not any(_running(pid) for pid in workers)

            await _until(all_gone, "every worker exited after its parent's SIGKILL")
            assert parent.output().count("shutting down") >= 2, parent.output()
        finally:
            parent.stop()
            if redis_pid is not None:  # the parent was to stop it; it was killed instead
                with contextlib.suppress(ProcessLookupError):
                    os.kill(redis_pid, signal.SIGTERM)
