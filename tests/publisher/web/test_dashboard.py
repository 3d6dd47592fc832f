"""/changefeeds/dashboard in a real browser: headless Chromium (Debian's `chromium` package;
`.ci/run` installs it) loads the page from a publisher with a listener and live commits, and the
DOM it renders must show the fleet's live data.

With CHANGEFEED_DASHBOARD_SCREENSHOT=path the test also stores a screenshot there (how
docs/img/dashboard.png is made).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from publisher.config.settings import Config
from tests.conftest import PublisherFactory
from tests.servers import RedisServer, scaled
from tests.wsclient import register, v1, v2

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


async def chromium(*args: str) -> bytes:
    assert CHROMIUM is not None
    process = await asyncio.create_subprocess_exec(
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--no-first-run", "--hide-scrollbars", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), scaled(60))
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode == 0, err.decode()[-2000:]
    return out


async def test_the_page_is_self_contained(publisher: object) -> None:
    url = publisher.url + "/changefeeds/dashboard"  # type: ignore[attr-defined]
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200 and response.content_type == "text/html"
        page = await response.text()
        assert "default-src 'none'" in response.headers["Content-Security-Policy"]
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "loads nothing elsewhere"


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
async def test_chromium_renders_live_fleet_data(
    tmp_path: Path,
    redis_server: RedisServer,
    make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    config = make_config(redis_server.url, fleet={"interval": 0.2, "ttl": 2})
    async with start_publisher(config) as a, start_publisher(config) as b:
        feeds = [
            await register(a.ws_url, v1("vm", ["nic", "alias"])),
            await register(b.ws_url, v1("vm", ["nic", "alias"])),
            await register(b.ws_url, v2({"network": ["ips"]}), version="~2"),
        ]
        http = aiohttp.ClientSession()
        sse = await http.get(b.url + "/changefeeds/sse?resource=vm&sub=nic")
        assert sse.status == 200

        async def commit_forever() -> None:
            i = 0
            while True:
                await a.bucket.publish("vm", f"vm-{i % 7}", ["nic"])
                i += 1
                await asyncio.sleep(0.02)

        committing = asyncio.create_task(commit_forever())
        try:
            url = a.url + "/changefeeds/dashboard"
            budget = "--virtual-time-budget=8000"
            dom = (await chromium(budget, "--dump-dom", url)).decode()
            shot = Path(os.environ.get("CHANGEFEED_DASHBOARD_SCREENSHOT", tmp_path / "d.png"))
            await chromium(budget, "--window-size=1280,860", f"--screenshot={shot}", url)
        finally:
            committing.cancel()
            for feed in feeds:
                await feed.close()
            sse.close()
            await http.close()
    status = re.search(r'<span id="status"[^>]*data-polls="(\d+)"[^>]*>([^<]*)<', dom)
    assert status is not None, dom[:3000]
    assert int(status.group(1)) >= 1
    assert status.group(2).startswith("live: 2 publisher(s), 4 listener(s)")
    assert re.search(r'<b id="t-sse">1</b>', dom), "one server-sent events stream"
    assert a.id in dom and b.id in dom
    assert re.search(r"<td>vm</td><td>nic, alias</td><td[^>]*>2</td>", dom)
    assert re.search(r"<td>network</td><td>ips</td><td[^>]*>1</td>", dom)
    assert ">no publisher reads PostgreSQL</td>" in dom  # neither has a capture or an outbox
    png = await asyncio.to_thread(shot.read_bytes)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
