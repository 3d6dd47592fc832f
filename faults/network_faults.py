"""Scenarios on the network between listeners and a publisher, through `changefeed_testing.proxy`:
a blackhole (a partition that drops nothing but delivers nothing), a drip (a link of a few
kilobytes per second), and a cut (every connection reset, new ones refused)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from changefeed_testing.proxy import Proxy
from faults.harness import Rig, Row, Size, exercise

DRIP_BYTES_PER_SECOND = 2000


async def _through_proxy(size: Size, directory: Path, name: str,
                         fault: Callable[[Proxy], None]) -> Row:
    """One publisher; two listeners reach it through a proxy, one directly (the control).
    `fault(proxy)` is applied for `size.fault` seconds, then the proxy passes bytes again."""
    async with Rig(directory) as rig:
        server = await rig.redis()
        config = rig.config(server)
        publisher = await rig.publisher(config)
        proxy = await rig.proxy(publisher.url)
        await rig.listener("via-proxy-1", proxy.url)
        await rig.listener("via-proxy-2", proxy.url)
        await rig.listener("direct", publisher.url)

        async def inject() -> None:
            fault(proxy)

        async def heal() -> None:
            proxy.pass_through()

        return await exercise(rig, await rig.writer(config, size), size, name, inject, heal)


async def proxy_blackhole(size: Size, directory: Path) -> Row:
    return await _through_proxy(size, directory, "listener link blackholed", Proxy.blackhole)


async def proxy_drip(size: Size, directory: Path) -> Row:
    return await _through_proxy(size, directory,
                                f"listener link dripping {DRIP_BYTES_PER_SECOND} B/s",
                                lambda proxy: proxy.drip(DRIP_BYTES_PER_SECOND))


async def proxy_cut(size: Size, directory: Path) -> Row:
    return await _through_proxy(size, directory, "listener link cut, reconnects refused",
                                lambda proxy: proxy.cut(refuse_new=True))
