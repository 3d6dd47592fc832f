"""`changefeed serve` as a process: start-up failures, the command line, signals, sd_notify.

Every test runs the real command in a subprocess and looks at what an operator sees: the exit
status, standard error, the HTTP answers, the datagrams systemd would get.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from websockets.asyncio.client import connect

from publisher.bucket import ChangeBucket
from publisher.bucket import connect as connect_redis
from tests.pki import new_token
from tests.servers import PublisherProcess, RedisServer, scaled, write_config
from tests.wsclient import register, v1


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: unix socket paths must stay under ~100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="cf-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "changefeed_cli", *args],
        capture_output=True, text=True, timeout=scaled(30), env={**os.environ, **(env or {})},
    )


def events(stderr: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def assert_one_line_failure(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit status 1, no traceback, and one `Error:` line (the last) saying each needle."""
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "Task was destroyed" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if not line.startswith("{")]
    assert len(errors) == 1, result.stderr
    (line,) = errors
    assert line.startswith("Error: ")
    for needle in needles:
        assert needle in line, line
    return line


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# --- start-up failures --------------------------------------------------------------------


def test_a_port_in_use_is_one_line_and_the_embedded_redis_is_stopped(short_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(short_dir / "config.js", None, stateDir=str(short_dir / "st"))
        result = run("serve", "--config", str(config), "--port", str(port))
    assert_one_line_failure(result, f"cannot listen on 127.0.0.1:{port}", "address already in use")
    (started,) = [e for e in events(result.stderr) if e["event"] == "embedded redis started"]
    assert gone(started["pid"])
    assert any(e["event"] == "embedded redis stopped" for e in events(result.stderr))


def test_a_second_serve_on_the_port_of_the_first_fails_at_once(
    short_dir: Path, redis_server: RedisServer
) -> None:
    """The README's steps run twice: the second process says why and exits."""
    first = PublisherProcess(write_config(short_dir / "config.js", redis_server.url), "--port", "0")
    first.start()
    try:
        port = first.url.rsplit(":", 1)[1]
        result = run("serve", "--config", str(first.config), "--port", port)
        assert_one_line_failure(result, "address already in use")
    finally:
        first.stop()


def test_a_config_syntax_error_names_the_file_and_line(short_dir: Path) -> None:
    config = short_dir / "config.js"
    config.write_text("// sample\nmodule.exports = {\n  maxAge: 3600,\n  resources: [,\n};\n")
    line = assert_one_line_failure(run("serve", "--config", str(config)), f"{config}:4")
    assert "a JavaScript object literal" in line


def test_a_duplicate_key_names_the_line_of_its_second_occurrence(short_dir: Path) -> None:
    config = short_dir / "config.js"
    config.write_text("{\n  maxAge: 3600,\n  resources: [],\n  maxAge: 60,\n}\n")
    assert_one_line_failure(run("serve", "--config", str(config)), f"{config}:4", "maxAge")


def test_a_state_dir_that_cannot_be_made_is_one_line(short_dir: Path) -> None:
    blocker = short_dir / "file"
    blocker.write_text("not a directory")
    config = write_config(short_dir / "config.js", None, stateDir=str(blocker / "state"))
    assert_one_line_failure(run("serve", "--config", str(config)), "stateDir", "Not a directory")


def test_a_state_dir_too_long_for_a_socket_is_one_line(short_dir: Path) -> None:
    config = write_config(short_dir / "config.js", None, stateDir=str(short_dir / ("s" * 120)))
    assert_one_line_failure(run("serve", "--config", str(config)), "stateDir", "short enough")


def test_a_bad_log_level_is_a_usage_error_not_a_traceback() -> None:
    result = run("--log-level", "bogus", "serve")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "'bogus' is not one of" in result.stderr


# --- the command line ---------------------------------------------------------------------


def test_bare_changefeed_version_and_h() -> None:
    bare = run()
    assert bare.returncode == 0 and "Commands:" in bare.stdout and "serve" in bare.stdout
    version = run("--version")
    assert version.returncode == 0 and re.fullmatch(r"changefeed, version \S+\n", version.stdout)
    for args in (("-h",), ("serve", "-h"), ("publish", "-h"), ("stats", "-h")):
        result = run(*args)
        assert result.returncode == 0 and result.stdout.startswith("Usage: ")


def test_every_option_of_serve_names_its_environment_variable() -> None:
    help_text = " ".join(run("serve", "--help").stdout.split())
    for name in ("CONFIG", "HOST", "PORT", "LOOP", "REDIS_URL"):
        assert f"env var: CHANGEFEED_{name}" in help_text


def test_environment_variables_set_options(short_dir: Path, redis_server: RedisServer) -> None:
    config = write_config(short_dir / "config.js", "redis://127.0.0.1:1/0")
    env = {
        "CHANGEFEED_CONFIG": str(config),
        "CHANGEFEED_REDIS_URL": redis_server.url,
        "CHANGEFEED_LOG_LEVEL": "warning",
    }
    result = run("publish", "vm", "a", "--sub", "nic", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_publish_prints_only_the_cursor(short_dir: Path) -> None:
    config = write_config(short_dir / "config.js", None, stateDir=str(short_dir / "st"))
    result = run("publish", "--config", str(config), "vm", "a", "--sub", "nic", "--data", "{}")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    (cursor,) = result.stdout.splitlines()
    assert "." in cursor


def test_library_log_records_are_json_lines_too() -> None:
    code = (
        "import logging; from publisher.config.logs import configure; configure(json=True); "
        "logging.getLogger('aiohttp.server').error('Error handling request'); "
        "logging.getLogger('asyncio').debug('dropped below the level')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    (record,) = events(result.stderr)
    assert record["logger"] == "aiohttp.server" and record["level"] == "error"
    assert record["event"] == "Error handling request" and "timestamp" in record


# --- signals and systemd ------------------------------------------------------------------


class Systemd:
    """The notify socket systemd would hold: datagrams in, split into `KEY=value` states."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(scaled(10))

    def next(self) -> dict[str, str]:
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.splitlines())

    def until(self, key: str) -> dict[str, str]:
        while True:
            states = self.next()
            if key in states:
                return states

    def close(self) -> None:
        self.sock.close()


async def get(url: str) -> tuple[int, Any]:
    timeout = aiohttp.ClientTimeout(total=scaled(5))
    async with aiohttp.ClientSession(timeout=timeout) as http, http.get(url) as response:
        return response.status, await response.json()


async def test_sd_notify_ready_watchdog_reloading_and_stopping(
    short_dir: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    systemd = Systemd(short_dir / "notify")
    monkeypatch.setenv("NOTIFY_SOCKET", str(systemd.path))
    monkeypatch.setenv("WATCHDOG_USEC", "200000")
    config = write_config(short_dir / "config.js", redis_server.url)
    server = PublisherProcess(config, "--port", "0").start()
    try:
        assert server.process is not None
        ready = await asyncio.to_thread(systemd.until, "READY")
        assert ready["READY"] == "1" and ready["MAINPID"] == str(server.process.pid)
        assert server.url in ready["STATUS"]
        await asyncio.to_thread(systemd.until, "WATCHDOG")
        server.process.send_signal(signal.SIGHUP)
        reloading = await asyncio.to_thread(systemd.until, "RELOADING")
        assert int(reloading["MONOTONIC_USEC"]) > 0
        await asyncio.to_thread(systemd.until, "READY")
        server.process.send_signal(signal.SIGTERM)
        stopping = await asyncio.to_thread(systemd.until, "STOPPING")
        assert stopping["STOPPING"] == "1"
        assert server.process.wait(scaled(10)) == 0
    finally:
        server.stop()
        systemd.close()


async def test_sighup_applies_live_keys_and_reports_the_fixed_ones(
    short_dir: Path, redis_server: RedisServer
) -> None:
    path = short_dir / "config.js"
    write_config(path, redis_server.url, limits={"pageSize": 5, "maxPageSize": 5})
    server = PublisherProcess(path, "--port", "0").start()
    try:
        assert server.process is not None
        status, _ = await get(server.url + "/vms?limit=10")
        assert status == 400
        write_config(
            path, redis_server.url, limits={"pageSize": 5, "maxPageSize": 50}, logLevel="debug",
            server={"host": "127.0.0.2", "maxConnections": 5000},
        )
        server.process.send_signal(signal.SIGHUP)
        reloaded = await wait_for_event(server, "config reloaded")
        assert reloaded["log_level"] == "debug" and reloaded["kept"] == ["server.host"]
        warned = await wait_for_event(server, "reload: these keys cannot change while "
                                              "serving; restart to apply them")
        assert warned["level"] == "warning" and warned["keys"] == ["server.host"]
        status, _ = await get(server.url + "/vms?limit=10")
        assert status == 200
        # A config that does not load is refused; the running one stays.
        path.write_text("module.exports = {")
        server.process.send_signal(signal.SIGHUP)
        failed = await wait_for_event(server, "reload failed: config.js kept as it was")
        assert failed["level"] == "error"
        assert (await get(server.url + "/vms?limit=10"))[0] == 200
    finally:
        server.stop()
    assert server.process.returncode == 0


async def wait_for_event(server: PublisherProcess, event: str) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + scaled(10)
    while asyncio.get_running_loop().time() < deadline:
        for line in server.output().splitlines():
            if line.startswith("{") and orjson.loads(line)["event"] == event:
                record: dict[str, Any] = orjson.loads(line)
                return record
        await asyncio.sleep(0.02)
    raise AssertionError(f"no {event!r} in:\n{server.output()}")


async def test_sigterm_drains_then_closes_listeners_with_1001(
    short_dir: Path, redis_server: RedisServer
) -> None:
    config = write_config(
        short_dir / "config.js", redis_server.url, health={"drainDelay": 600}
    )
    server = PublisherProcess(config, "--port", "0").start()
    try:
        assert server.process is not None
        feed = await register(server.ws_url, v1())
        assert (await get(server.url + "/readyz"))[0] == 200
        server.process.send_signal(signal.SIGTERM)
        await wait_for_event(server, "draining: not ready, waiting before closing listeners")
        status, body = await get(server.url + "/readyz")
        assert status == 503 and body["checks"]["draining"] is True
        assert any("draining" in reason for reason in body["reasons"])
        assert (await get(server.url + "/healthz"))[0] == 200
        # The listener is still served while draining; a second SIGTERM ends the delay.
        server.process.send_signal(signal.SIGTERM)
        await feed.ws.wait_closed()
        assert feed.ws.close_code == 1001
        assert await asyncio.to_thread(server.process.wait, scaled(10)) == 0
    finally:
        server.stop()


async def test_sighup_rotates_tokens_without_dropping_a_registered_listener(
    short_dir: Path, redis_server: RedisServer
) -> None:
    """Issue 12, item 3, through the real signal: the token file is rotated and SIGHUP'd; the
    old token is refused from then on, the new one accepted, and the listener registered with
    the old token keeps receiving changes."""
    path, token_file = short_dir / "config.js", short_dir / "ops.token"
    old, new = new_token(), new_token()
    token_file.write_text(old)
    auth = {"tokens": [{"name": "ops", "tokenFile": str(token_file), "scopes": ["admin"]}]}
    write_config(path, redis_server.url, auth=auth)
    server = PublisherProcess(path, "--port", "0").start()
    try:
        assert server.process is not None
        headers = {"Accept-Version": "~1", "Authorization": f"Bearer {old}"}
        async with connect(server.ws_url, additional_headers=headers) as ws:
            await ws.send(orjson.dumps(v1("vm", ["nic"])).decode())
            orjson.loads(await asyncio.wait_for(ws.recv(), scaled(5)))

            token_file.write_text(new)
            server.process.send_signal(signal.SIGHUP)
            await wait_for_event(server, "security reloaded")
            assert (await status_with(server.url + "/changefeeds", old)) == 401
            assert (await status_with(server.url + "/changefeeds", new)) == 200

            bucket = ChangeBucket(connect_redis(redis_server.url), "test")
            cursor = await bucket.publish("vm", "after-reload", ["nic"])
            await bucket.aclose()
            item = orjson.loads(await asyncio.wait_for(ws.recv(), scaled(5)))
            assert item["cursor"] == cursor
    finally:
        server.stop()
    assert new not in server.output() and old not in server.output(), "no token in the logs"


async def status_with(url: str, token: str) -> int:
    timeout = aiohttp.ClientTimeout(total=scaled(5))
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(timeout=timeout) as http, http.get(url, headers=headers) as r:
        return r.status
