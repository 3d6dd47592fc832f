"""The pull consumer example of docs/listener.md, run as written against a real publisher."""

from __future__ import annotations

import asyncio
import types
from pathlib import Path
from typing import Any

import orjson

from publisher.server.service import Service
from tests.listener.app import doc_example, vm
from tests.servers import eventually, scaled


def example_module() -> types.ModuleType:
    return doc_example("vmaudit")


def lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def run_until(module: types.ModuleType, url: str, path: Path, count: int) -> None:
    """Run the service until the file has `count` lines, then stop it as SIGTERM would."""
    audit = module.VmAudit(url, path)
    task = asyncio.create_task(audit.run())
    await eventually(lambda: len(lines(path)) >= count or task.done(), f"{count} lines", 20)
    audit.stop()
    async with asyncio.timeout(scaled(10)):
        await task


async def test_the_audit_log_has_each_change_once_across_restarts_and_a_gap_line(
    publisher: Service, tmp_path: Path
) -> None:
    module = example_module()
    bucket = publisher.bucket
    path = tmp_path / "vm-audit.jsonl"

    async def commit(prefix: str, count: int) -> list[str]:
        return [await bucket.commit("vm", f"{prefix}-{n}", ["nic"], vm(f"{prefix}-{n}"))
                for n in range(count)]

    first = await commit("a", 5)
    await run_until(module, publisher.url, path, 5)
    more = await commit("b", 3)  # while the service is down
    await run_until(module, publisher.url, path, 8)
    assert [line["cursor"] for line in lines(path)] == first + more
    assert lines(path)[0] == {"id": "a-0", "changes": ["nic"],
                              "published": lines(path)[0]["published"], "cursor": first[0]}

    # While the service is down, changes happen and age out of the log: a gap.
    await commit("gone", 3)
    await asyncio.sleep(0.005)  # let every item become older than the 1 ms maxAge
    assert await bucket.log.trim(0.001) == 11
    new = await commit("c", 2)
    await run_until(module, publisher.url, path, 11)
    written = lines(path)
    assert written[8] == {"gap_after": more[-1], "cursor": None}
    assert [line["cursor"] for line in written[9:]] == new and len(written) == 11
