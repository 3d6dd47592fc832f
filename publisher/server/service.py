"""The publisher service: the HTTP routes, the websocket fan-out, the tail and the trimmer,
assembled on one aiohttp application.

The shared objects go on the application under `publisher.web.app_keys`, where the handlers find
them; this module imports the handler modules only to add their routes: `ROUTE_MODULES` lists
every module of `publisher.web` that declares routes (its module-level `routes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

import structlog
from aiohttp import web

from changefeed.cursor import ZERO
from changefeed.errors import BucketUnavailable, ChangefeedError, ConfigError, ListenFailed
from changefeed.protocol import CHANGEFEEDS, CloseCode
from changefeed.tasks import wait_ended
from publisher.bucket import ChangeBucket, open_bucket
from publisher.config.reload import fixed_changes, keep_fixed
from publisher.config.security import check_exposure
from publisher.config.settings import Config
from publisher.delivery.hub import Hub
from publisher.delivery.pings import ping_forever
from publisher.delivery.tail import Tail
from publisher.delivery.trace import TraceLog
from publisher.delivery.window import Window
from publisher.outbox.relay import Relay
from publisher.pull.durable import Durables
from publisher.security import tls
from publisher.security.auth import now
from publisher.security.clientaddr import Trusted
from publisher.server.supervise import supervise
from publisher.web import (
    bootstrap_routes,
    dashboard,
    durable_routes,
    health,
    metrics,
    poll_routes,
    sse,
    trace_route,
    websocket,
)
from publisher.web.access import Access, check_reload
from publisher.web.admission import (
    MAX_LINGERING,
    RESERVED_FILES,
    Admission,
    Guard,
    file_limit,
    fitting_cap,
)
from publisher.web.app_keys import (
    ACCESS,
    BOOTSTRAPS,
    BUCKET,
    CAPTURE,
    HUB,
    LIFECYCLE,
    LIVE,
    OUTBOX,
    TAIL,
    Lifecycle,
    Live,
)
from publisher.web.bootstrap_routes import bootstraps_of, resource_routes
from publisher.web.durable_routes import DURABLES
from publisher.web.edge import edge
from publisher.web.fleet import Advertiser
from publisher.web.metrics import METRICS, Metrics
from publisher.web.revocation import expire_forever, revoke

if TYPE_CHECKING:
    from publisher.capture.runner import CaptureRunner  # imported when config.js has capture

log = structlog.get_logger(__name__)

BACKLOG = 128
"""Connections the kernel queues for accept()."""
READY_TIMEOUT = 10.0
"""How long start() waits for the first read of the bucket before serving anyway."""
ROUTE_MODULES = (
    websocket, bootstrap_routes, sse, poll_routes, durable_routes, health, metrics, dashboard,
    trace_route,
)
"""Every module of `publisher.web` that declares routes (a module-level `routes`), in the order
the application adds them; the bootstrap routes of the config's resources come last
(`resource_routes`). The one place that lists them (docs/architecture.md, "Routes")."""


def _security(config: Config) -> tuple[Access, ssl.SSLContext | None]:
    """The access checks and the TLS context of `config`: raises ConfigError when it may not
    serve (a public address without auth, unreadable token or certificate files)."""
    security = config.security
    check_exposure(config.server.host, security)
    access = Access(security, {r.bootstrap_route: r.resource for r in config.resources})
    return access, None if security.tls is None else tls.server_context(security.tls)


class Service:
    """A publisher process: `await start()`, then `url`; `await stop()` closes listeners (1001)."""

    def __init__(
        self, config: Config, publisher_id: str | None = None, *, reuse_port: bool = False
    ) -> None:
        """`reuse_port`: listen with SO_REUSEPORT, sharing the port with other processes that do
        (the workers of `changefeed serve --workers N`); the kernel spreads connections."""
        if config.bucket.redis_url is None:
            raise ChangefeedError("Service needs a Redis URL (the CLI starts an embedded Redis)")
        # Security first: a config that may not serve fails before anything is opened.
        self.access, self.ssl = _security(config)
        self.config = config
        self.resources = config.resource_map
        self.id = publisher_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"
        self.redis_url = config.bucket.redis_url
        self.bucket: ChangeBucket = open_bucket(config)
        if not self.bucket.log.ordered and config.durable.consumers:
            raise ConfigError(
                "durable.consumers", sorted(config.durable.consumers),
                "none with a Redis Cluster bucket (a durable consumer's dispatch is one atomic "
                "compare-and-set of its position with the read of the log, which needs the log "
                "in one slot; the bucket is not `ordered`: docs/scaling.md#redis-cluster)",
            )
        # The tail's own connections (one per shard): a blocking XREAD never waits behind
        # requests, nor they on it.
        self._tail_bucket = open_bucket(config, tail=True)
        self.hub = Hub(
            Window(config.limits.window, ZERO), self.bucket, config.limits.send_buffer,
            coalesce_ids=config.limits.coalesce_ids,
        )
        self.tail = Tail(self._tail_bucket, self.hub)
        self._assemble(config)
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self.on_reload: list[Callable[[Config, Config], list[str]]] = []
        """Reloadable parts beyond this module's (the security settings: tokens, TLS): each is
        called with (old, new) config on `reload` and returns the keys it could not apply."""
        self.on_reload.append(self._reload_security)
        self.url = ""
        self.reuse_port = reuse_port

    def _assemble(self, config: Config) -> None:
        """The application: its admission, its middleware, the shared objects under their
        `AppKey`s (publisher.web.app_keys), its routes and background work."""
        self.lifecycle = Lifecycle(self.id)
        self.live = Live(config)
        self.admission = Admission(
            config.server.max_connections,
            config.server.max_connections_per_client,
            exempt=Trusted(config.server.trusted_proxies),
        )
        self.app = web.Application(client_max_size=config.server.max_body_bytes)
        self.metrics = Metrics(self.app, self.admission)
        # One middleware: who may do what, every error as JSON, every request counted
        # (refusals too).
        self.app.middlewares.append(edge(self.metrics, self.access))
        self.access.report_connections_refused(lambda: sum(self.admission.refusals.values()))
        self.access.trust(config.server.trusted_proxies)
        self.hub.fanout.observe(self.metrics.latency.observe)
        self._trace(config)
        self.app[ACCESS] = self.access
        self.app[LIVE] = self.live
        self.app[BUCKET] = self.bucket
        self.app[HUB] = self.hub
        self.app[TAIL] = self.tail
        self.app[LIFECYCLE] = self.lifecycle
        self.app[METRICS] = self.metrics
        self.app[BOOTSTRAPS] = bootstraps_of(config.resources)
        self.app[DURABLES] = Durables(self.bucket, self.hub, config.durable, self.resources)
        self.relay: Relay | None = None
        """The outbox relay (config.js `outbox`), started with the background tasks."""
        if config.outbox is not None:
            self.relay = self.app[OUTBOX] = Relay(
                self.bucket, config.outbox, self.resources, config.outbox.url(), self.id
            )
        self.capture: CaptureRunner | None = None
        """The capture (config.js `capture`), started with the background
        tasks; imported only then (its driver is the postgres extra's)."""
        if config.capture is not None:
            from publisher.capture.runner import CaptureRunner

            self.capture = CaptureRunner(self.bucket, config.capture, self.resources,
                                         config.capture.url(), self.id)
            self.app[CAPTURE] = self.capture.stats
        self._add_routes()
        self.advertiser = Advertiser(self.app, self.metrics.activity)
        self.app.cleanup_ctx.append(self._background)
        self.app.on_shutdown.append(self._close_listeners)

    def _add_routes(self) -> None:
        for module in ROUTE_MODULES:
            self.app.router.add_routes(module.routes)
        self.app.router.add_routes(resource_routes(self.config.resources))

    @property
    def unregistered(self) -> set[web.WebSocketResponse]:
        """Sockets still expected to send their registration."""
        return self.lifecycle.unregistered

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http") + CHANGEFEEDS

    def reload_security(self, config: Config) -> None:
        """Serve with `config`'s security from now on (for SIGHUP): its tokens (token files and
        environment variables read again), allowedOrigins and clientLimits, and its TLS
        certificate and client CA for new connections. Registered listeners whose credentials
        the new settings refuse are closed with 1008 (publisher.web.revocation); other established
        connections are untouched. Raises ConfigError, changing nothing, if `config` may not be
        served (a public address without auth, unreadable token or certificate files, TLS
        turned on or off)."""
        security = config.security
        check_exposure(self.config.server.host, security)
        check_reload(self.access.security, security)
        if security.tls is not None:
            probe = tls.server_context(security.tls)  # every file checked before any swap
            del probe
        self.access.replace(security)
        revoke(self.hub, self.access.authenticator, now())
        if security.tls is not None and self.ssl is not None:
            tls.load(self.ssl, security.tls)
        log.info("security reloaded", authentication=security.authenticating,
                 tls=security.tls is not None, origins=len(security.allowed_origins))

    def _reload_security(self, old: Config, new: Config) -> list[str]:
        """The `on_reload` part of the security settings: applied whole, or kept whole."""
        try:
            self.reload_security(new)
        except ConfigError as exc:
            log.warning("security not reloaded: the old settings stay", error=str(exc))
            return [f"auth/tls ({exc})"]
        return []

    async def start(self) -> None:
        """Serve. Raises ListenFailed when the listening socket cannot be opened, and
        PartitionMismatch when the bucket has another partition count than configured (a Redis
        that cannot be reached yet is waited for in the background). A failed start leaves
        nothing running."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        with contextlib.suppress(BucketUnavailable):
            await self.bucket.log.ensure()
        server = self.config.server
        admission = self.admission
        # The socket first, not serving yet: a port in use fails here, before any task starts.
        try:
            self._server = await asyncio.get_running_loop().create_server(
                lambda: Guard(admission, self._handlers()),
                server.host,
                server.port,
                reuse_address=True,
                reuse_port=self.reuse_port or None,
                backlog=BACKLOG,
                ssl=self.ssl,
                start_serving=False,
            )
        except OSError as exc:
            raise ListenFailed(server.host, server.port, exc) from None
        # handler_cancellation: a long poll whose client went away stops waiting at once.
        # keepalive_timeout: aiohttp's one timer for a connection without a request in progress,
        # idle or still sending its request head. lingering_time: how long the unread body of a
        # finished request is read and dropped before the connection is closed.
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            keepalive_timeout=server.idle_timeout,
            lingering_time=server.body_timeout,
        )
        await self._runner.setup()
        self._fit_connections_to_files()
        await self._server.start_serving()
        host, port = self._server.sockets[0].getsockname()[:2]
        scheme = "http" if self.ssl is None else "https"
        self.url = f"{scheme}://{host}:{port}"
        self.advertiser.url = self.url
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.tail.started.wait(), READY_TIMEOUT)
        if not self.tail.started.is_set():
            log.warning("bucket not reachable yet; serving, registrations are refused (1013)")

    def _handlers(self) -> web.Server:
        assert self._runner is not None and self._runner.server is not None
        return self._runner.server

    async def drain(self) -> None:
        """SIGTERM: say not ready (`/readyz` 503) and wait `health.drainDelay` seconds, for load
        balancers to stop sending new listeners here; `stop()` then closes the listeners."""
        self.lifecycle.drain()
        delay = self.live.config.health.drain_delay
        if delay:
            log.info("draining: not ready, waiting before closing listeners", seconds=delay)
            await asyncio.sleep(delay)

    def reload(self, config: Config) -> list[str]:
        """Apply `config` (config.js read again, SIGHUP) as far as it can change while serving:
        the limits, the connection caps, the trusted proxies, trimming (`maxAge`, `maxItems`,
        `gcInterval`), `health`, `fleet`, `trace`, and whatever the `on_reload` parts apply.
        Returns the keys that changed but cannot change live (the listening address, the Redis,
        the bucket, the resources...): they keep their old values until a restart."""
        old = self.live.config
        fixed = fixed_changes(old, config)
        applied = keep_fixed(old, config)
        self.live.config = self.config = applied
        self.hub.fanout.limit(applied.limits.send_buffer)
        self.hub.lagging.limit(applied.limits.coalesce_ids)
        self.admission.limit(
            applied.server.max_connections, applied.server.max_connections_per_client,
            Trusted(applied.server.trusted_proxies),
        )
        self.access.trust(applied.server.trusted_proxies)
        self._trace(applied)
        self._fit_connections_to_files()
        for part in self.on_reload:
            fixed.extend(part(old, config))
        return fixed

    def _trace(self, config: Config) -> None:
        """Record the delivery trace as `config.trace` says (started, resized or stopped)."""
        trace = config.trace
        fanout = self.hub.fanout
        if not trace.enabled:
            fanout.trace_with(None)
        elif fanout.trace is None:
            fanout.trace_with(TraceLog(trace.items, trace.max_age))
        else:
            fanout.trace.resize(trace.items, trace.max_age, time.time())
        # A bucket in a Redis Cluster: the hub remembers which window position each of the
        # newest changes got, for the trace route to find a commit's cursor.
        self.hub.order.keep(trace.items if trace.enabled else 0)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()  # accept no more; the runner then ends every connection
            self._server = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.access.close()

    def _fit_connections_to_files(self) -> None:
        """Keep the connection cap below the open-file limit, so accept() never fails."""
        reserved = RESERVED_FILES + MAX_LINGERING + self.config.bucket.pool_size + 2
        files = file_limit()
        cap = fitting_cap(self.live.config.server.max_connections, files, reserved)
        if cap < self.admission.most:
            log.warning(
                "server.maxConnections lowered to fit the open-file limit",
                configured=self.admission.most, lowered_to=cap, open_file_limit=files,
            )
        self.admission.limit(cap, min(self.admission.per_client, cap), self.admission.exempt)

    async def _background(self, app: web.Application) -> AsyncIterator[None]:
        restarts = self.metrics.activity.restarts
        work: dict[str, Callable[[], Awaitable[None]]] = {
            "trim": self._trim_forever,
            "advertise": self.advertiser.run,
            "expire": lambda: expire_forever(self.hub, self.access),
            "ping": lambda: ping_forever(self.hub, lambda: self.live.config.limits.ping_interval),
        }
        # The tail and the relay handle every error themselves, and say so in their own metrics.
        tasks = [asyncio.create_task(self.tail.run(), name="tail")] + [
            asyncio.create_task(supervise(name, run, restarts), name=name)
            for name, run in work.items()
        ]
        if self.relay is not None:
            tasks.append(self.relay.start())
        if self.capture is not None:
            tasks.append(self.capture.start())
        yield
        self.tail.stop()
        for task in tasks[1:]:
            task.cancel()
        try:
            await wait_ended(*tasks)  # a cancelled shutdown still closes what it opened
        finally:
            await self.advertiser.withdraw()
            await self.bucket.aclose()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._tail_bucket.aclose(), 1.0)

    async def _trim_forever(self) -> None:
        activity = self.metrics.activity
        while True:
            await asyncio.sleep(self.live.config.trim_every)
            config = self.live.config
            try:
                removed = await self.bucket.log.trim(config.max_age, config.max_items)
            except BucketUnavailable as exc:
                activity.redis_failed("trim")
                log.warning("gc skipped: bucket unavailable", error=str(exc))
                continue
            activity.trimmed(removed)
            (log.info if removed else log.debug)(
                "gc run",
                removed=removed,
                max_age=config.max_age,
                max_items=config.max_items,
            )

    async def _close_listeners(self, app: web.Application) -> None:
        self.lifecycle.drain()
        self.lifecycle.stopping.set()
        self.hub.release_waiters()  # long polls answer now instead of holding the shutdown up
        conns = list(self.hub.connections)
        if conns:
            log.info("closing listeners: shutting down", listeners=len(conns))
        for conn in conns:
            self.hub.close_now(conn, CloseCode.GOING_AWAY, "publisher shutting down")
        for ws in list(self.unregistered):
            await ws.close(code=CloseCode.GOING_AWAY, message=b"publisher shutting down")
        self.unregistered.clear()
