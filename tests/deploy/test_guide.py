"""docs/guide.md's snippets, run as a new user runs them, each against real servers.

The Python ones run as scripts in a directory holding the sample config.js (a free port for the
publisher instead of 8080, and for the service instead of 8000); the only other change to a
snippet is where it connects. A listener on the publisher must then hear what the snippet wrote.
The Node snippet runs in clients/js/test/guide.test.mjs, the Spark one in
tests/publisher/spark/test_guide.py.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, cast

import aiohttp
import psycopg
import pytest

from changefeed_testing.postgres import PostgresServer
from listener import BootstrapDone, Listener
from tests.publisher.outbox.rig import fresh_database, outbox_section
from tests.servers import PublisherProcess, RedisServer, drain, free_port, scaled, write_config

ROOT = Path(__file__).parents[2]
GUIDE = ROOT / "docs" / "guide.md"
SNIPPET = re.compile(r"<!-- guide: ([\w-]+) -->\n```(\w+)\n(.*?)^```", re.S | re.M)
PATHS = {"redis-service", "in-process", "outbox", "node", "spark"}


def snippet(name: str) -> str:
    found: dict[str, str] = {match[0]: match[2] for match in SNIPPET.findall(GUIDE.read_text())}
    assert name in found, f"docs/guide.md lost its {name} snippet"
    return found[name]


def test_the_guide_has_a_snippet_for_each_path() -> None:
    assert {match[0] for match in SNIPPET.findall(GUIDE.read_text())} == PATHS


def sample_config(directory: Path, port: int, **bucket: str) -> Path:
    """The sample config.js on `port`, with `bucket` keys (redisUrl) added."""
    text = (ROOT / "config.js").read_text()
    assert text.count("port: 8080,") == 1
    text = text.replace("port: 8080,", f"port: {port},")
    for key, value in bucket.items():
        text = text.replace("    bucket: {\n", f"    bucket: {{\n        {key}: {value!r},\n", 1)
    path = directory / "config.js"
    path.write_text(text)
    return path


@contextmanager
def script(directory: Path, name: str, text: str) -> Iterator[subprocess.Popen[bytes]]:
    """Run `text` as `name` in `directory` until the block ends; its output shows on failure."""
    path = directory / name
    path.write_text(text)
    process = subprocess.Popen([sys.executable, str(path)], cwd=directory,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    drain(process, lines)
    try:
        yield process
    except BaseException:
        print("".join(lines))
        raise
    finally:
        process.terminate()
        process.wait(scaled(10))


async def until_serving(url: str, process: subprocess.Popen[bytes]) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(int(scaled(400))):
            assert process.poll() is None, "the snippet exited"
            try:
                async with http.get(url) as reply:
                    if reply.status < 500:
                        return
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never answered")


@asynccontextmanager
async def listening(url: str) -> AsyncIterator[asyncio.Queue[object]]:
    """A `Listener` for vm changes on the publisher at `url`: its events, once bootstrapped."""
    events: asyncio.Queue[object] = asyncio.Queue()
    ready = asyncio.Event()

    async def listen() -> None:
        async with Listener(url, instance="guide", service="guide",
                            resources={"vm": ["*"]}) as feed:
            async for event in feed:
                if isinstance(event, BootstrapDone):
                    ready.set()
                await events.put(event)

    task = asyncio.create_task(listen())
    try:
        await asyncio.wait_for(ready.wait(), scaled(20))
        yield events
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def change_of(events: asyncio.Queue[object], id: str) -> str:
    """The cursor of the next change of vm `id` the listener is given."""
    while True:
        event = await asyncio.wait_for(events.get(), scaled(20))
        if getattr(event, "id", None) == id and hasattr(event, "cursor"):
            return str(event.cursor)


async def test_the_python_service_commits_and_the_publisher_beside_it_tells(
    tmp_path: Path,
) -> None:
    config = sample_config(tmp_path, free_port())
    service_port = free_port()
    publisher = PublisherProcess(config).start()
    try:
        service = snippet("redis-service").replace("port=8000", f"port={service_port}")
        with script(tmp_path, "vmapi.py", service) as process:
            url = f"http://127.0.0.1:{service_port}"
            await until_serving(url, process)
            async with listening(publisher.url) as events, aiohttp.ClientSession() as http:
                vm = {"uuid": "4b5c", "alias": "web-1"}
                headers = {"Idempotency-Key": "rename-4b5c"}
                replies = []
                for _ in range(2):  # the client retries: written once, answered the same
                    async with http.put(f"{url}/vms/4b5c", json=vm, headers=headers) as reply:
                        assert reply.status == 200, await reply.text()
                        replies.append(await reply.json())
                assert replies[0] == replies[1]
                assert await change_of(events, "4b5c") == replies[0]["cursor"]
                async with http.get(f"{publisher.url}/vms") as reply:
                    assert (await reply.json())["items"] == [vm]
    finally:
        publisher.stop()


async def test_the_publisher_inside_the_service_serves_listeners(
    tmp_path: Path, redis_server: RedisServer,
) -> None:
    port = free_port()
    sample_config(tmp_path, port, redisUrl=redis_server.url)
    service = snippet("in-process").replace("port=8000", f"port={free_port()}")
    with script(tmp_path, "inprocess.py", service) as process:
        publisher = f"http://127.0.0.1:{port}"
        await until_serving(f"{publisher}/changefeeds", process)
        async with listening(publisher) as events:
            from publisher import ChangeBucket, connect, load_config

            config = load_config(tmp_path / "config.js")
            bucket = ChangeBucket(connect(redis_server.url), config.bucket.name, config.resources)
            try:
                cursor = await bucket.commit("vm", "9f2e", ["alias"], {"uuid": "9f2e"})
            finally:
                await bucket.aclose()
            assert await change_of(events, "9f2e") == cursor


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    yield server
    server.remove()


async def test_the_outbox_snippet_commits_the_row_and_its_change_together(
    tmp_path: Path, redis_server: RedisServer, postgres: PostgresServer,
) -> None:
    database = await fresh_database(postgres.url())
    with psycopg.connect(database, autocommit=True) as db:
        db.execute("INSERT INTO vms VALUES ('4b5c', '{\"uuid\": \"4b5c\", \"alias\": \"old\"}')")
    config = write_config(tmp_path / "config.js", redis_server.url,
                          outbox=outbox_section(database))
    publisher = PublisherProcess(config).start()
    try:
        namespace: dict[str, object] = {}
        exec(compile(snippet("outbox"), "guide:outbox", "exec"), namespace)
        rename_vm = cast(Callable[[psycopg.Connection[Any], str, str], None],
                         namespace["rename_vm"])
        async with listening(publisher.url) as events:
            with psycopg.connect(database) as db:
                await asyncio.to_thread(rename_vm, db, "4b5c", "web-1")
            await change_of(events, "4b5c")
            async with aiohttp.ClientSession() as http, http.get(f"{publisher.url}/vms") as reply:
                assert (await reply.json())["items"] == [{"uuid": "4b5c", "alias": "web-1"}]
            # A transaction rolled back leaves no change behind: the next change the listener
            # is given is the one committed after it.
            with psycopg.connect(database) as db, pytest.raises(ZeroDivisionError), \
                    db.transaction():
                rename_vm(db, "4b5c", "never")
                raise ZeroDivisionError
            with psycopg.connect(database) as db:
                await asyncio.to_thread(rename_vm, db, "4b5c", "web-2")
            cursor = await change_of(events, "4b5c")
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{publisher.url}/vms") as reply:
                    assert (await reply.json())["items"] == [{"uuid": "4b5c", "alias": "web-2"}]
                query = {"resource": "vm", "sub": "alias", "order": "oldest"}
                async with http.get(f"{publisher.url}/changefeeds/events", params=query) as reply:
                    items = (await reply.json())["items"]
            assert [item["cursor"] for item in items][-1] == cursor
            assert len(items) == 2, items
    finally:
        publisher.stop()
