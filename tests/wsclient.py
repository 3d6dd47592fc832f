"""A bare websocket listener for the publisher tests (the real listener library has its own)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.servers import scaled


def v1(resource: str = "vm", subs: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "instance": "de1aac97-6f85-4ba9-b51e-514f48a6a46c",
        "service": "tcns",
        "changeKind": {"resource": resource, "subResources": subs or ["nic", "alias"]},
    }
    body.update(extra)
    return body


def v2(kinds: dict[str, list[str]], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "instance": "7b0a1c2d-0000-4000-8000-000000000002",
        "service": "napi",
        "resources": [{"resource": r, "subResources": s} for r, s in kinds.items()],
    }
    body.update(extra)
    return body


class Feed:
    """A registered websocket: `reply` is the registration reply; `next()` the next item."""

    def __init__(self, ws: ClientConnection, reply: dict[str, Any]) -> None:
        self.ws = ws
        self.reply = reply

    async def next(self, timeout: float = 5.0) -> dict[str, Any]:
        frame = await asyncio.wait_for(self.ws.recv(), scaled(timeout))
        item: dict[str, Any] = orjson.loads(frame)
        return item

    async def take(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        return [await self.next(timeout) for _ in range(n)]

    async def quiet(self, seconds: float = 0.3) -> bool:
        """True when nothing arrives for `seconds` (used after the expected items only)."""
        try:
            frame = await asyncio.wait_for(self.ws.recv(), seconds)
        except TimeoutError:
            return True
        raise AssertionError(f"unexpected frame: {frame!r}")

    async def close(self) -> None:
        await self.ws.close()


async def register(
    ws_url: str, body: dict[str, Any] | str | bytes, version: str | None = "~1",
    headers: dict[str, str] | None = None, **kwargs: Any,
) -> Feed:
    """Register with `body`; `headers` are sent besides Accept-Version (e.g. Authorization)."""
    sent = {"Accept-Version": version} if version else {}
    ws = await connect(ws_url, additional_headers={**sent, **(headers or {})}, **kwargs)
    await ws.send(body if isinstance(body, str | bytes) else orjson.dumps(body).decode())
    reply = orjson.loads(await asyncio.wait_for(ws.recv(), scaled(5)))
    return Feed(ws, reply)


async def refused(ws_url: str, frame: str | bytes, version: str | None = "~1") -> tuple[int, str]:
    """Send `frame` as a registration; return the close code and reason the publisher sent."""
    headers = {"Accept-Version": version} if version else {}
    async with connect(ws_url, additional_headers=headers, max_size=None) as ws:
        await ws.send(frame)
        try:
            extra = await asyncio.wait_for(ws.recv(), scaled(5))
            raise AssertionError(f"registration accepted: {extra!r}")
        except ConnectionClosed as closed:
            assert closed.rcvd is not None, "closed without a close frame"
            return closed.rcvd.code, closed.rcvd.reason
