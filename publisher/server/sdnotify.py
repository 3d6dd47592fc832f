"""systemd's notify protocol, spoken directly: one datagram to `$NOTIFY_SOCKET` per state.

The unit is `Type=notify` (deploy/changefeed.service): systemd counts the service started when
`READY=1` arrives (after the listening socket is open), hears `RELOADING=1` / `READY=1` around a
SIGHUP reload and `STOPPING=1` when it drains, and restarts it when the `WATCHDOG=1` pings, sent
from the event loop every half `WatchdogSec`, stop (a loop that hangs stops them).

Without `$NOTIFY_SOCKET` (not under systemd) every call does nothing.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

import structlog

log = structlog.get_logger(__name__)


class Notifier:
    """Sends states to the socket systemd named in `$NOTIFY_SOCKET` (read once, here)."""

    def __init__(self, address: str | None = None) -> None:
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")
        # An address starting with '@' is in the abstract namespace.
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog = _watchdog_interval()

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def notify(self, *states: str) -> None:
        """Send `states` ("READY=1", "STATUS=...") in one datagram; a failure is logged, never
        raised (systemd gone is no reason to stop serving)."""
        if not self.address:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto("\n".join(states).encode(), self.address)
        except OSError as exc:
            log.warning("sd_notify failed", socket=self.address, error=str(exc))

    def ready(self, status: str) -> None:
        self.notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def reloading(self) -> None:
        monotonic_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.notify("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec}")

    def stopping(self, status: str) -> None:
        self.notify("STOPPING=1", f"STATUS={status}")

    async def watchdog_forever(self) -> None:
        """Ping the watchdog every half of `WATCHDOG_USEC` while the event loop runs."""
        if not self.address or self.watchdog is None:
            return
        while True:
            self.notify("WATCHDOG=1")
            await asyncio.sleep(self.watchdog / 2)


def _watchdog_interval() -> float | None:
    """systemd's watchdog interval in seconds, when it is meant for this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 1e6


__all__ = ["Notifier"]
