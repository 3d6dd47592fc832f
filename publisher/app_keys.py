"""What the handlers share, kept on the aiohttp application under `web.AppKey`s.

`service.py` creates the objects and stores them here; the route modules (`routes.py`,
`websocket.py`, `poll_routes.py`) read them from `request.app`. So no handler module imports the
service, and the service imports the handlers only to add them: no import circle.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web

from publisher.access import Access
from publisher.bucket import ChangeBucket
from publisher.config import Config
from publisher.hub import Hub
from publisher.tail import Tail


@dataclass(slots=True)
class Lifecycle:
    """The process's state that handlers consult: its id, its sockets not yet registered, and
    whether it is stopping (a handler cancelled then was stopped, not dropped by its peer)."""

    publisher_id: str
    unregistered: set[web.WebSocketResponse] = field(default_factory=set)
    """Sockets still expected to send their registration."""
    stopping: asyncio.Event = field(default_factory=asyncio.Event)


CONFIG = web.AppKey("config", Config)
BUCKET = web.AppKey("bucket", ChangeBucket)
HUB = web.AppKey("hub", Hub)
TAIL = web.AppKey("tail", Tail)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
ACCESS = web.AppKey("access", Access)

__all__ = ["ACCESS", "BUCKET", "CONFIG", "HUB", "LIFECYCLE", "TAIL", "Lifecycle"]
