"""What the handlers share, kept on the aiohttp application under `web.AppKey`s.

`service.py` creates the objects and stores them here; the route modules (`bootstrap_routes.py`,
`websocket.py`, `poll_routes.py`) read them from `request.app`. So no handler module imports the
service, and the service imports the handlers only to add them: no import circle.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from aiohttp import web

from changefeed.protocol import Resource
from publisher.bucket import ChangeBucket
from publisher.capture.stats import CaptureStats
from publisher.config.settings import Config
from publisher.delivery.hub import Hub
from publisher.delivery.tail import Tail
from publisher.outbox.relay import Relay
from publisher.web.access import Access


@dataclass(slots=True)
class Lifecycle:
    """The process's state that handlers consult: its id, its sockets not yet registered, and
    whether it is stopping (a handler cancelled then was stopped, not dropped by its peer)."""

    publisher_id: str
    unregistered: set[web.WebSocketResponse] = field(default_factory=set)
    """Sockets still expected to send their registration."""
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    draining: bool = False
    """SIGTERM was received: `/readyz` answers 503 while listeners are still served."""
    refused: Counter[int] = field(default_factory=Counter)
    """Websocket registrations refused since start, by the close code they were sent."""
    abnormal_closures: int = 0
    """Websockets whose connection ended without a close frame (1006), since start."""

    def drain(self) -> None:
        """Say not ready from now on (SIGTERM, or the shutdown)."""
        self.draining = True

    def count_refused(self, code: int) -> None:
        """Count a websocket registration refused with close code `code`."""
        self.refused[code] += 1

    def count_abnormal_closure(self) -> None:
        """Count a websocket that ended without a close frame."""
        self.abnormal_closures += 1


@dataclass(slots=True)
class Live:
    """The config as last (re)loaded (SIGHUP): the one config every handler reads. What may
    not change while serving (the resources, the Redis...) keeps its start-up value in it
    (publisher.config.reload)."""

    config: Config


BUCKET = web.AppKey("bucket", ChangeBucket)
HUB = web.AppKey("hub", Hub)
TAIL = web.AppKey("tail", Tail)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
ACCESS = web.AppKey("access", Access)
LIVE = web.AppKey("live", Live)
OUTBOX = web.AppKey("outbox", Relay)
"""The outbox relay, when config.js has `outbox` (absent otherwise)."""
CAPTURE = web.AppKey("capture", CaptureStats)
"""The capture's stats, when config.js has `capture` (absent otherwise)."""
BOOTSTRAPS = web.AppKey("bootstraps", dict[str, Resource])
"""The config resource of each bootstrap route (its page's and its objects'), by the route's
pattern (aiohttp's `canonical`): how the module-level handlers of `bootstrap_routes.py` know
theirs."""

__all__ = [
    "ACCESS", "BOOTSTRAPS", "BUCKET", "CAPTURE", "HUB", "LIFECYCLE", "LIVE", "OUTBOX", "TAIL",
    "Lifecycle", "Live",
]
