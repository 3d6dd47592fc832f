"""Joyent's `changefeed` npm package (1.5), the listener of existing Triton services, against our
publisher: the README's compatibility claim, checked by running the real client.

The package is installed from the npm registry with the lock file of tests/compat/npm/ into
.cache/npm-changefeed (once; again only when the lock file changes). tests/compat/npm/listen.js
runs its Listener and prints each event as a JSON line. The package registers with v1
(`Accept-Version: ~1`, `changeKind`) when it is given one resource and with v2 (`~2`,
`resources`) when it is given several. node and npm are required: without them the tests fail,
they are never skipped (`.ci/run` installs them).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import queue
import shutil
import subprocess
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
import structlog

from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.servers import RedisServer, free_port, scaled

HERE = Path(__file__).parent / "npm"
INSTALL = Path(__file__).parents[2] / ".cache" / "npm-changefeed"
VERSION = "1.5."


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: the npm compatibility tests need node and npm "
                    "(`.ci/run` installs them: apt-get install nodejs npm)")
    return found


@pytest.fixture(scope="session")
def node_modules() -> Path:
    """.cache/npm-changefeed/node_modules with the locked changefeed 1.5 and its dependencies."""
    node, npm = _tool("node"), _tool("npm")
    files = [HERE / "package.json", HERE / "package-lock.json"]
    stamp = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
    INSTALL.parent.mkdir(exist_ok=True)
    with open(INSTALL.parent / "npm-changefeed.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent test runs install once
        done = INSTALL / "installed-from"
        if not (done.exists() and done.read_text() == stamp):
            shutil.rmtree(INSTALL, ignore_errors=True)
            INSTALL.mkdir()
            for file in files:
                shutil.copy(file, INSTALL)
            # No install scripts: the listener needs none of the native modules of the
            # package's publisher side (moray, dtrace).
            result = subprocess.run(
                [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=INSTALL,
                capture_output=True, text=True, timeout=scaled(300),
            )
            assert result.returncode == 0, f"npm ci failed:\n{result.stdout}{result.stderr}"
            done.write_text(stamp)
    installed = subprocess.run(
        [node, "-p", "require('changefeed/package.json').version"], cwd=INSTALL,
        capture_output=True, text=True, timeout=scaled(30), check=True,
    ).stdout.strip()
    assert installed.startswith(VERSION), f"changefeed {installed} installed, not {VERSION}x"
    return INSTALL / "node_modules"


class NpmListener:
    """listen.js in a subprocess; its events (JSON lines) arrive on a queue."""

    def __init__(self, node_modules: Path, stderr: Path, **options: Any) -> None:
        self.stderr_path = stderr
        self._stderr = stderr.open("wb")
        self.process = subprocess.Popen(
            [_tool("node"), str(HERE / "listen.js"), orjson.dumps(options).decode()],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            env={**os.environ, "NODE_PATH": str(node_modules)},
        )
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.events.put(orjson.loads(line))
        self.events.put(None)  # it exited

    async def next(self) -> dict[str, Any]:
        try:
            event = await asyncio.to_thread(self.events.get, timeout=scaled(20))
        except queue.Empty:
            raise AssertionError(f"no event from the npm listener:\n{self.log()}") from None
        assert event is not None, f"the npm listener exited:\n{self.log()}"
        return event

    async def expect(self, kind: str) -> dict[str, Any]:
        """The next event, which must be of `kind`; its data."""
        event = await self.next()
        assert event["event"] == kind, f"expected {kind}, got {event}\n{self.log()}"
        return dict(event.get("data", {}))

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(scaled(10))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._stderr.close()


@contextlib.asynccontextmanager
async def npm_listener(node_modules: Path, tmp_path: Path, **options: Any
                       ) -> AsyncIterator[NpmListener]:
    listener = NpmListener(node_modules, tmp_path / f"{options['instance']}.log", **options)
    try:
        yield listener
    finally:
        await asyncio.to_thread(listener.close)


def registered(logs: Sequence[Mapping[str, Any]], instance: str) -> list[Mapping[str, Any]]:
    return [e for e in logs if e["event"] == "listener registered" and e["instance"] == instance]


def item_of(cursor: str, resource: str, subs: list[str], id: str) -> dict[str, Any]:
    return {"changeKind": {"resource": resource, "subResources": subs},
            "changedResourceId": id, "cursor": cursor}


def received(data: dict[str, Any]) -> dict[str, Any]:
    """A received item without `published` (a time, checked for form only)."""
    assert data.pop("published").isdigit()
    return data


async def test_v1_one_resource(
    publisher: Service, node_modules: Path, tmp_path: Path
) -> None:
    bucket = publisher.bucket
    with structlog.testing.capture_logs() as logs:
        async with npm_listener(node_modules, tmp_path, url=publisher.url, instance="npm-v1",
                                service="compat",
                                changeKind={"resource": "vm", "subResources": ["nic"]}) as npm:
            reply = await npm.expect("bootstrap")
            assert reply["resource"] == "vm" and reply["bootstrapRoute"] == "/vms"
            commits = [
                ("vm", ["nic"], "vm-1"), ("vm", ["alias"], "vm-2"), ("network", ["ips"], "n-1"),
                ("vm", ["alias", "nic"], "vm-3"), ("vm", ["nic"], "vm-1"),
            ]
            expected = []
            for resource, subs, id in commits:
                cursor = await bucket.commit(resource, id, subs, {"id": id})
                if resource == "vm" and "nic" in subs:
                    expected.append(item_of(cursor, resource, subs, id))
            got = [received(await npm.expect("change")) for _ in expected]
            assert got == expected
    assert [e["version"] for e in registered(logs, "npm-v1")] == [1]


async def test_v2_several_resources(
    publisher: Service, node_modules: Path, tmp_path: Path
) -> None:
    bucket = publisher.bucket
    resources = [{"resource": "vm", "subResources": ["state"]},
                 {"resource": "network", "subResources": ["*"]}]
    with structlog.testing.capture_logs() as logs:
        async with npm_listener(node_modules, tmp_path, url=publisher.url, instance="npm-v2",
                                service="compat", resources=resources) as npm:
            # The package emits one `bootstrap` per entry of the v2 reply's bootstrapRoutes.
            routes = [await npm.expect("bootstrap") for _ in resources]
            assert [(r["resource"], r["bootstrapRoute"]) for r in routes] == [
                ("vm", "/vms"), ("network", "/networks")]
            commits = [
                ("vm", ["nic"], "vm-1"), ("network", ["ips"], "n-1"), ("vm", ["state"], "vm-2"),
                ("network", ["name", "ips"], "n-2"), ("vm", ["alias"], "vm-3"),
                ("vm", ["state", "nic"], "vm-4"),
            ]
            expected = []
            for resource, subs, id in commits:
                cursor = await bucket.commit(resource, id, subs, {"id": id})
                if resource == "network" or "state" in subs:
                    expected.append(item_of(cursor, resource, subs, id))
            got = [received(await npm.expect("change")) for _ in expected]
            assert got == expected
    assert [e["version"] for e in registered(logs, "npm-v2")] == [2]


async def test_registers_again_after_the_publisher_restarts(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory, node_modules: Path, tmp_path: Path,
) -> None:
    """A publisher that stops closes the socket with 1001: the package backs off, registers
    again (a new `bootstrap`: it never resumes) and receives what is committed afterwards."""
    config = make_config(redis_server.url, server={"host": "127.0.0.1", "port": free_port()})
    url = f"http://127.0.0.1:{config.server.port}"
    backoff = {"minTimeout": 50, "maxTimeout": 500, "retries": 1000}
    async with npm_listener(node_modules, tmp_path, url=url, instance="npm-again",
                            service="compat", backoff=backoff,
                            changeKind={"resource": "vm", "subResources": ["*"]}) as npm:
        async with start_publisher(config) as first:
            await npm.expect("bootstrap")
            cursor = await first.bucket.commit("vm", "vm-1", ["nic"], {})
            assert received(await npm.expect("change"))["cursor"] == cursor
        await npm.expect("connection-end")
        async with start_publisher(config) as second:
            # Its retries meet a closed port first (each an `error` event), and, while the new
            # publisher's tail is still starting, a refusal (1013, try again later: a
            # `connection-end`); then it registers.
            while (event := await npm.next())["event"] in ("error", "connection-end"):
                pass
            assert event["event"] == "bootstrap", event
            cursor = await second.bucket.commit("vm", "vm-2", ["state"], {})
            assert received(await npm.expect("change"))["cursor"] == cursor
