"""The life of a `changefeed serve` process after start-up: signals, reloads, draining, and what
systemd is told of them (`publisher.server.sdnotify`).

- SIGHUP: config.js is read again and applied as far as it can be while serving
  (`Service.reload`); what cannot change live is logged at warning, a config that does not load
  is logged at error and the running one kept. The log level follows the new `logLevel` unless
  `--log-level` (or `CHANGEFEED_LOG_LEVEL`) set it.
- SIGTERM, SIGINT: drain (`/readyz` answers 503, `health.drainDelay`), then listeners are closed
  with 1001 and long polls answered. A second signal skips what is left of the delay.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from changefeed.errors import ChangefeedError
from changefeed.tasks import cancel_and_wait
from publisher.config.logs import set_level
from publisher.config.settings import Config
from publisher.server.sdnotify import Notifier
from publisher.server.service import Service

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class Signals:
    """What the signal handlers set."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    hangup: asyncio.Event = field(default_factory=asyncio.Event)
    stops: int = 0

    def stopped(self) -> None:
        self.stops += 1
        self.stop.set()


class Supervisor:
    """Runs a started `Service` until SIGTERM/SIGINT, reloading it on SIGHUP."""

    def __init__(
        self,
        reread: Callable[[], Config],
        log_level: str | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.reread = reread
        self.log_level = log_level
        """`--log-level` when given: it then wins over config.js's `logLevel`."""
        self.notifier = notifier or Notifier()

    def install(self, loop: asyncio.AbstractEventLoop) -> Signals:
        """Handle the signals from now on (before start-up, so that a SIGTERM while starting
        stops the process once it has started, cleanly)."""
        signals = Signals()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, signals.stopped)
        loop.add_signal_handler(signal.SIGHUP, signals.hangup.set)
        return signals

    async def run(self, service: Service, signals: Signals) -> None:
        notifier = self.notifier
        notifier.ready(f"listening on {service.url}")
        background = [
            asyncio.create_task(notifier.watchdog_forever(), name="watchdog"),
            asyncio.create_task(self._reload_on_hangup(service, signals), name="reload"),
        ]
        try:
            await signals.stop.wait()
            notifier.stopping("draining")
            log.info("shutting down", listeners=len(service.hub.connections))
            if signals.stops == 1:
                drain = asyncio.create_task(service.drain())
                again = asyncio.create_task(_second(signals))
                await asyncio.wait({drain, again}, return_when=asyncio.FIRST_COMPLETED)
                for task in (drain, again):
                    task.cancel()
            await service.stop()
        finally:
            await cancel_and_wait(*background)

    async def _reload_on_hangup(self, service: Service, signals: Signals) -> None:
        while True:
            await signals.hangup.wait()
            signals.hangup.clear()
            self.notifier.reloading()
            self.reload(service)
            self.notifier.ready(f"listening on {service.url}")

    def reload(self, service: Service) -> None:
        """Read config.js again and apply it (SIGHUP)."""
        try:
            config = self.reread()
        except ChangefeedError as exc:
            log.error("reload failed: config.js kept as it was", error=str(exc))
            return
        fixed = service.reload(config)
        level = self.log_level or config.log_level or "info"
        set_level(level)
        if fixed:
            log.warning(
                "reload: these keys cannot change while serving; restart to apply them",
                keys=fixed,
            )
        log.info("config reloaded", log_level=level, kept=fixed)


async def _second(signals: Signals) -> None:
    """Return at the second SIGTERM/SIGINT."""
    while signals.stops < 2:
        signals.stop.clear()
        await signals.stop.wait()


__all__ = ["Signals", "Supervisor"]
