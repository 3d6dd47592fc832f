"""`changefeed snoop` in a subprocess against a real publisher."""

from __future__ import annotations

import asyncio
import signal
import sys

import orjson

from changefeed.protocol import ChangeItem
from listener.events import ChangeEvent
from listener.snoop import format_change
from publisher.server.service import Service
from tests.servers import default_sigint, scaled


async def read_line(stream: asyncio.StreamReader) -> str:
    async with asyncio.timeout(scaled(15)):
        line = await stream.readline()
    assert line, "snoop exited"
    return line.decode()


async def test_snoop_prints_changes_as_json_lines_and_stops_on_ctrl_c(publisher: Service) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "changefeed_cli", "--log-format", "json", "snoop",
        publisher.url, "vm", "--sub", "nic,alias",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        preexec_fn=default_sigint,
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        while '"event": "registered"' not in await read_line(process.stderr):
            pass
        first = await publisher.bucket.commit("vm", "a", ["nic"], {"uuid": "a"})
        await publisher.bucket.commit("vm", "b", ["state"], {"uuid": "b"})  # not listened for
        await publisher.bucket.commit("network", "n", ["ips"], {"uuid": "n"})
        last = await publisher.bucket.commit("vm", "c", ["alias", "state"], None, delete=True)
        lines = [orjson.loads(await read_line(process.stdout)) for _ in range(2)]
        assert [(line["changedResourceId"], line["cursor"]) for line in lines] == [
            ("a", first), ("c", last)
        ]
        assert lines[1]["changeKind"] == {"resource": "vm", "subResources": ["alias", "state"]}
        process.send_signal(signal.SIGINT)
        async with asyncio.timeout(scaled(10)):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_snoop_shows_reconnects_and_resumes(publisher: Service) -> None:
    """--since resumes after a cursor; a publisher restart is reported on stderr."""
    before = await publisher.bucket.commit("vm", "a", ["nic"], {"uuid": "a"})
    missed = await publisher.bucket.commit("vm", "b", ["nic"], {"uuid": "b"})
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "changefeed_cli", "--log-format", "json", "snoop",
        publisher.url, "vm", "--since", before,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        preexec_fn=default_sigint,
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        assert orjson.loads(await read_line(process.stdout))["cursor"] == missed
        await publisher.stop()
        while "reconnecting" not in await read_line(process.stderr):
            pass
        process.send_signal(signal.SIGINT)
        async with asyncio.timeout(scaled(10)):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_snoop_with_ids_and_prefixes_prints_only_those(publisher: Service) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "changefeed_cli", "--log-format", "json", "snoop",
        publisher.url, "vm", "--prefix", "servers", "--id", "x",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        preexec_fn=default_sigint,
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        while '"event": "registered"' not in await read_line(process.stderr):
            pass
        await publisher.bucket.publish_many(
            ("vm", id, ["nic"]) for id in ("serversX", "servers/1", "x/1", "x", "servers")
        )
        lines = [orjson.loads(await read_line(process.stdout)) for _ in range(3)]
        assert [line["changedResourceId"] for line in lines] == ["servers/1", "x", "servers"]
        process.send_signal(signal.SIGINT)
        async with asyncio.timeout(scaled(10)):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def test_readable_lines() -> None:
    item = ChangeItem("vm", ("nic", "alias"), "78615996", 1730000000454, "e.1")
    assert format_change(ChangeEvent(item), as_json=False) == (
        "2024-10-27T03:33:20.454Z  vm         78615996  nic,alias  e.1"
    )
    assert orjson.loads(format_change(ChangeEvent(item), as_json=True)) == item.to_wire()
