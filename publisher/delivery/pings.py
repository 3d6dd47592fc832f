"""Keepalive for the whole publisher: one sweep over the registered websockets, no timer each.

Every `limits.pingInterval / 2` seconds one task looks at each registered websocket's `quiet`
count: the sweeps since the listener last sent anything (a `heartbeat` text, a ping, a pong,
any frame; the read loop in publisher.web.websocket sets it back to 0). `verdict` says what to do
with it, and the sweep only carries that out:

| `quiet` before the sweep | silent for at least | the sweep                                   |
| ------------------------ | ------------------- | ------------------------------------------- |
| 0, 1                     | 0, 1/2 interval     | nothing                                     |
| 2                        | one interval        | writes a ping frame to the transport        |
| 3 or more                | 1.5 intervals       | closes it with 1001 (no pong within 1/2 int.) |

A listener is pinged after one to 1.5 intervals of silence, and a dead one is closed (and its
registration forgotten) after 1.5 to 2 intervals; one that answers pings, or sends anything
else as often, is never closed. The interval is read from the live config at every sweep, so a
reload applies from the next one. Server-sent events streams have their own keepalive
(publisher.web.sse) and are skipped.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable

import structlog

from changefeed.protocol import CloseCode
from publisher.delivery.hub import Hub, Subscriber

log = structlog.get_logger(__name__)

PING_FRAME = b"\x89\x00"
"""A ping with no payload: FIN and opcode 0x9, length 0, unmasked (the server's frames are)."""
NO_PONG = "no pong within {:g} s"
"""The close reason of a listener that did not answer a ping (the seconds: half an interval)."""


class Verdict(enum.Enum):
    WAIT = "wait"
    PING = "ping"
    DEAD = "dead"


def verdict(quiet: int) -> Verdict:
    """What a sweep does to a websocket that earlier sweeps found silent `quiet` times in a row."""
    if quiet < 2:
        return Verdict.WAIT
    if quiet == 2:
        return Verdict.PING
    return Verdict.DEAD


def sweep(hub: Hub, interval: float) -> tuple[int, int]:
    """One sweep of `hub`'s websockets with `limits.pingInterval` `interval`: ping the quiet
    ones, close the dead ones; returns (pinged, closed)."""
    dead: list[Subscriber] = []
    pinged = 0
    for conn in hub.connections:
        if conn.sse or conn.closing:
            continue
        action = verdict(conn.swept())
        if action is Verdict.PING:
            transport = conn.transport
            if not transport.is_closing():
                transport.write(PING_FRAME)
                pinged += 1
        elif action is Verdict.DEAD:
            dead.append(conn)
    reason = NO_PONG.format(interval / 2)
    for conn in dead:  # after the loop: closing a connection removes it from hub.connections
        log.info(
            "listener closed: no pong",
            instance=conn.registration.instance,
            service=conn.registration.service,
            remote=conn.remote,
            seconds=interval / 2,
        )
        hub.close_now(conn, CloseCode.GOING_AWAY, reason, "noPong")
    return pinged, len(dead)


async def ping_forever(hub: Hub, interval: Callable[[], float]) -> None:
    """Sweep `hub` every half `interval()` seconds (asked again before each sweep)."""
    while True:
        seconds = interval()
        await asyncio.sleep(seconds / 2)
        sweep(hub, seconds)


__all__ = ["NO_PONG", "PING_FRAME", "Verdict", "ping_forever", "sweep", "verdict"]
