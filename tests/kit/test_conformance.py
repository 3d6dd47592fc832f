"""`changefeed conformance`, run as users run it (a subprocess), against the real publisher and
against a deliberately wrong one."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import WSMsgType, web
from click.testing import CliRunner

from changefeed_cli import main
from changefeed_testing import RunningPublisher, scaled
from changefeed_testing.conformance.cli import conformance as conformance_command


async def conformance(*args: str) -> tuple[int, str]:
    """Run `changefeed conformance ARGS`; its exit status and output."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "changefeed_cli", "--log-level", "warning", "conformance",
        "--timeout", str(scaled(5)), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), scaled(120))
    assert process.returncode is not None
    return process.returncode, output.decode()


def statuses(output: str) -> dict[str, str]:
    report: dict[str, Any] = orjson.loads(output)
    return {check["name"]: check["status"] for check in report["checks"]}


async def test_the_publisher_conforms(changefeed_publisher: RunningPublisher) -> None:
    code, output = await conformance(changefeed_publisher.url, "--config",
                                     str(changefeed_publisher.config_path))
    assert code == 0, output
    assert "27 checks: 27 passed, 0 failed, 0 not run" in output
    probes = re.search(r"^wrote (\d+) probe change\(s\) of vm into the live bucket: "
                       r"(conformance-\w+-)0 \.\. (conformance-\w+-)(\d+) \(listeners of vm "
                       r"receive them\)$", output, re.M)
    assert probes is not None, output
    assert probes[2] == probes[3] and int(probes[4]) + 1 == int(probes[1]) > 0
    for name in ("registration-v1", "registration-v2", "bad-binary-frame", "item-shape",
                 "resume", "resume-foreign-since"):
        assert f"  {name} " in output


async def test_without_a_way_to_commit_the_item_checks_say_they_did_not_run(
    changefeed_publisher: RunningPublisher,
) -> None:
    code, output = await conformance(changefeed_publisher.ws_url, "--wait", "0.2", "--json")
    assert code == 0, output
    got = statuses(output)
    not_run = {name for name, status in got.items() if status == "not_run"}
    assert not_run == {"item-shape", "item-order", "item-matching", "resume"}
    assert set(got.values()) == {"pass", "not_run"}

    code, output = await conformance(changefeed_publisher.url, "--wait", "0.2", "--strict",
                                     "--check", "item-shape")
    assert code == 1, output
    assert "no change arrived within 0.2 s; pass --config or --publish-command" in output


async def test_a_publish_command_causes_the_changes(
    changefeed_publisher: RunningPublisher,
) -> None:
    command = (f"{sys.executable} -m changefeed_cli --log-level warning publish --config "
               f"{changefeed_publisher.config_path} {{resource}} {{id}} --sub {{sub}}")
    code, output = await conformance(changefeed_publisher.url, "--publish-command", command,
                                     "--check", "item-shape", "--json")
    assert code == 0, output
    assert statuses(output) == {"resources": "pass", "item-shape": "pass"}


# --- a publisher that gets the protocol wrong ----------------------------------------------------

RESOURCES = {"resources": [{"resource": "vm", "subResources": ["nic", "alias"],
                            "bootstrapRoute": "/vms"}]}


async def wrong_websocket(request: web.Request) -> web.WebSocketResponse:
    """Upgrades whatever the Accept-Version, replies without a bootstrapRoute, accepts frames
    that are not JSON, and closes binary frames with 1011."""
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    message = await ws.receive()
    if message.type is WSMsgType.BINARY:
        await ws.close(code=1011, message=b"")
    elif message.type is WSMsgType.TEXT:
        try:
            frame = orjson.loads(message.data)
        except orjson.JSONDecodeError:
            frame = {}
        kind = frame.get("changeKind", {}) if isinstance(frame, dict) else {}
        await ws.send_str(orjson.dumps({"resource": kind.get("resource", "vm"),
                                        "subResources": ["nic", "alias"]}).decode())
        async for _ in ws:
            pass
    return ws


@contextlib.asynccontextmanager
async def wrong_publisher() -> AsyncIterator[str]:
    async def changefeeds(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await wrong_websocket(request)
        return web.json_response(RESOURCES)

    app = web.Application()
    app.router.add_get("/changefeeds", changefeeds)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_wrong_publisher_is_reported_and_exits_1() -> None:
    async with wrong_publisher() as url:
        # --timeout 2 (the last wins): a silent wrong publisher costs that much per check.
        code, output = await conformance(url, "--wait", "0.2", "--json", "--timeout", "2")
        _, table = await conformance(url, "--check", "registration-v1")
    assert code == 1, output
    got = statuses(output)
    assert got["resources"] == "pass"
    for name in ("registration-v1", "registration-v2", "accept-version-refused", "bad-not-json",
                 "bad-unknown-resource", "bad-binary-frame", "bad-second-registration"):
        assert got[name] == "fail", (name, output)
    details = {c["name"]: c["detail"] for c in orjson.loads(output)["checks"]}
    assert details["bad-binary-frame"] == "closed with 1011, expected 1003"
    assert details["accept-version-refused"] == "Accept-Version ~9 was upgraded, expected HTTP 400"
    assert "reply.bootstrapRoute is not a non-empty string" in details["registration-v1"]
    assert "does NOT conform" in table and "FAIL" in table


def test_usage_errors_and_the_list_of_checks() -> None:
    # The command itself, not through `main`: main configures structlog for the whole process.
    assert main.commands["conformance"] is conformance_command
    runner = CliRunner()
    listed = runner.invoke(conformance_command, ["--list"])
    assert listed.exit_code == 0 and "bad-second-registration" in listed.output
    both = runner.invoke(conformance_command, ["http://x", "--config", "c.js",
                                               "--publish-command", "true"])
    assert both.exit_code == 2 and "exclude each other" in both.output
    unknown = runner.invoke(conformance_command, ["http://x", "--check", "nope"])
    assert unknown.exit_code == 2 and "unknown check(s): nope" in unknown.output
