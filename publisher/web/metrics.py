"""`GET /metrics`: the publisher in Prometheus' text format, with the `prometheus-client` library.

Each `Service` has its own `CollectorRegistry`. What the publisher counts already (the hub's
deliveries and closes, the tail's faults and lag, the long polls waiting, the admission's
refusals) is read when Prometheus scrapes, by `_Collector`, never counted twice; only the
commit-to-write latency (a histogram, observed once per item written, not per listener) and the
HTTP requests (`Metrics.count`, called by the middleware, publisher.web.edge) are recorded as they
happen. docs/operations.md#metrics lists them.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version

from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram, PlatformCollector, ProcessCollector
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from changefeed.protocol import CloseCode
from publisher.capture.stats import metric_families as capture_metrics
from publisher.outbox.metrics import metric_families as outbox_metrics
from publisher.web.admission import Admission
from publisher.web.app_keys import CAPTURE, HUB, LIFECYCLE, OUTBOX, TAIL
from publisher.web.health import tail_reasons

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
"""Seconds from a commit to its write to listeners: milliseconds when all is well, seconds when
the tail fell behind."""

REFUSAL_REASONS: dict[int, str] = {
    CloseCode.PROTOCOL_ERROR: "protocol_error",
    CloseCode.UNSUPPORTED_DATA: "unsupported_data",
    CloseCode.INVALID_DATA: "invalid_data",
    CloseCode.POLICY_VIOLATION: "invalid_registration",
    CloseCode.MESSAGE_TOO_BIG: "too_big",
    CloseCode.TRY_AGAIN_LATER: "bucket_unavailable",
    CloseCode.OVERLOADED: "overloaded",
}
"""The `reason` label of a refused registration, by the close code it was sent."""

RESYNC_CAUSES = {"trimGap": "trim_gap", "epochChange": "epoch_change", "rollback": "rollback"}
"""Closes with 4009 (the listener must bootstrap again), by the hub's cause."""


def package_version() -> str:
    try:
        return version("changefeed")
    except PackageNotFoundError:
        return "unknown"


@dataclass(slots=True)
class Activity:
    """What the service's own background work counts: trimming and advertising."""

    items_trimmed: int = 0
    redis_errors: Counter[str] = field(default_factory=Counter)
    """Failed Redis operations of background work, by operation (trim, advertise)."""
    restarts: Counter[str] = field(default_factory=Counter)
    """Background tasks that ended or failed and were started again, by task
    (`publisher.server.supervise`)."""

    def trimmed(self, removed: int) -> None:
        """Count `removed` items trimmed from the log."""
        self.items_trimmed += removed

    def redis_failed(self, operation: str) -> None:
        """Count a failed Redis operation of background work (`trim`, `advertise`)."""
        self.redis_errors[operation] += 1


_Family = GaugeMetricFamily | CounterMetricFamily | InfoMetricFamily
"""What a collector yields."""


class _Collector(Collector):
    """Reads the publisher's own counters and gauges at each scrape."""

    def __init__(self, app: web.Application, admission: Admission, activity: Activity) -> None:
        self.app = app
        self.admission = admission
        self.activity = activity

    def collect(self) -> Iterator[_Family]:
        yield from self._process()
        yield from self._registrations()
        yield from self._deliveries()
        yield from self._closes()
        yield from self._tail()
        yield from self._background()
        yield from self._outbox()

    def _process(self) -> Iterator[_Family]:
        info = InfoMetricFamily("changefeed_publisher", "This publisher process.")
        info.add_metric(
            [], {"publisher": self.app[LIFECYCLE].publisher_id, "version": package_version()}
        )
        yield info

    def _registrations(self) -> Iterator[_Family]:
        """The listeners, the connections, and what was refused."""
        hub, lifecycle = self.app[HUB], self.app[LIFECYCLE]
        listeners = GaugeMetricFamily(
            "changefeed_listeners", "Registered websocket listeners, by resource and protocol "
            "version (a listener of several resources counts once for each).",
            labels=["resource", "version"],
        )
        by_kind: Counter[tuple[str, str]] = Counter()
        for conn in hub.connections:
            version_ = str(conn.registration.version)
            for kind in conn.registration.kinds:
                by_kind[kind.resource, version_] += 1
        for (resource, version_), count in sorted(by_kind.items()):
            listeners.add_metric([resource, version_], count)
        yield listeners
        yield GaugeMetricFamily(
            "changefeed_connections", "Open TCP connections (HTTP, long polls and websockets).",
            value=self.admission.open,
        )
        refused = CounterMetricFamily(
            "changefeed_registrations_refused", "Websocket registrations refused, by reason.",
            labels=["reason"],
        )
        reasons: Counter[str] = Counter()
        for code, count in lifecycle.refused.items():
            reasons[REFUSAL_REASONS.get(code, f"close_{code}")] += count
        for reason, count in sorted(reasons.items()):
            refused.add_metric([reason], count)
        yield refused
        yield CounterMetricFamily(
            "changefeed_websocket_abnormal_closures",
            "Websockets whose connection ended without a close frame (1006; counted 101 in "
            "changefeed_http_requests_total).",
            value=lifecycle.abnormal_closures,
        )
        connections_refused = CounterMetricFamily(
            "changefeed_connections_refused", "TCP connections refused at admission, by limit.",
            labels=["limit"],
        )
        for limit, count in sorted(self.admission.refusals.items()):
            connections_refused.add_metric([limit], count)
        yield connections_refused

    def _deliveries(self) -> Iterator[_Family]:
        """What the hub wrote, to websockets and server-sent events streams."""
        hub = self.app[HUB]
        yield CounterMetricFamily(
            "changefeed_items_delivered", "Change items written to listeners (one per listener).",
            value=hub.counters.delivered,
        )
        yield CounterMetricFamily(
            "changefeed_written_bytes", "Bytes of change items written to listeners.",
            value=hub.counters.bytes_written,
        )
        yield GaugeMetricFamily(
            "changefeed_sse_subscribers", "Open server-sent events streams (/changefeeds/sse).",
            value=sum(1 for conn in hub.connections if conn.sse),
        )
        yield CounterMetricFamily(
            "changefeed_sse_items_sent",
            "Change items written to server-sent events streams (in items_delivered too).",
            value=hub.counters.sse_delivered,
        )
        sse_ended = CounterMetricFamily(
            "changefeed_sse_disconnects",
            "Server-sent events streams ended, by who ended them (listener or publisher).",
            labels=["by"],
        )
        for by in ("listener", "publisher"):
            sse_ended.add_metric([by], hub.counters.sse_ended[by])
        yield sse_ended

    def _closes(self) -> Iterator[_Family]:
        """Listeners the hub closed, and the coalesced catch-ups of slow ones."""
        hub = self.app[HUB]
        yield CounterMetricFamily(
            "changefeed_slow_consumer_closes", "Listeners closed with 4008 (slow consumer).",
            value=hub.counters.closed["slowConsumer"],
        )
        yield CounterMetricFamily(
            "changefeed_no_pong_closes",
            "Listeners closed with 1001 for not answering a ping (dead peers).",
            value=hub.counters.closed["noPong"],
        )
        yield CounterMetricFamily(
            "changefeed_credentials_revoked_closes",
            "Listeners closed with 1008: their token or identity was revoked or expired.",
            value=hub.counters.closed["credentialsRevoked"],
        )
        yield CounterMetricFamily(
            "changefeed_coalesced_catch_ups",
            "Coalesced catch-ups of slow listeners (registered with coalesce) that ended live.",
            value=hub.counters.coalesced["finished"],
        )
        yield CounterMetricFamily(
            "changefeed_coalesced_items",
            "Change items folded into coalesced catch-ups (sent as one item per id).",
            value=hub.counters.coalesced["items"],
        )
        resyncs = CounterMetricFamily(
            "changefeed_resyncs", "Listeners closed with 4009 (bootstrap again), by cause.",
            labels=["cause"],
        )
        for cause, label in RESYNC_CAUSES.items():
            resyncs.add_metric([label], hub.counters.closed[cause])
        yield resyncs

    def _tail(self) -> Iterator[_Family]:
        """The tail's lag, health and faults."""
        tail = self.app[TAIL]
        items, seconds = tail.lag()
        yield GaugeMetricFamily(
            "changefeed_tail_lag_items", "Log items the tail is behind the bucket's head.",
            value=items,
        )
        yield GaugeMetricFamily(
            "changefeed_tail_lag_seconds",
            "Commit time between the bucket's head and the tail's last item read.",
            value=seconds,
        )
        yield GaugeMetricFamily(
            "changefeed_tail_healthy", "1 while the tail reads the bucket, 0 while it retries.",
            value=int(tail.healthy),
        )
        yield CounterMetricFamily(
            "changefeed_items_lost", "Items trimmed before the tail read them.",
            value=tail.faults.items_lost,
        )
        errors = CounterMetricFamily(
            "changefeed_redis_errors", "Redis operations that failed (unreachable), by operation.",
            labels=["operation"],
        )
        errors.add_metric(["tail"], tail.faults.redis_errors)
        for operation in ("trim", "advertise"):
            errors.add_metric([operation], self.activity.redis_errors[operation])
        yield errors
        yield CounterMetricFamily(
            "changefeed_redis_reconnects", "Times the tail read the bucket again after failing.",
            value=tail.faults.reconnects,
        )
        yield CounterMetricFamily(
            "changefeed_tail_unexpected_errors",
            "Tail reads that failed with an error that is not Redis's (logged with a traceback; "
            "the tail reads again after a backoff). Above 0: report it.",
            value=tail.faults.unexpected,
        )

    def _background(self) -> Iterator[_Family]:
        """The long polls waiting, the trimming, readiness and draining."""
        yield GaugeMetricFamily(
            "changefeed_long_polls_waiting", "Long polls (events, feed) waiting for new items.",
            value=self.app[HUB].waiters.waiting,
        )
        yield CounterMetricFamily(
            "changefeed_items_trimmed", "Items this publisher trimmed from the log.",
            value=self.activity.items_trimmed,
        )
        restarts = CounterMetricFamily(
            "changefeed_background_restarts", "Background tasks (trim, advertise, expire, ping) "
            "that ended or failed with an error no handler expected (logged with a traceback) and "
            "were started again after a backoff. Above 0: report it.", labels=["task"],
        )
        for task in ("trim", "advertise", "expire", "ping"):
            restarts.add_metric([task], self.activity.restarts[task])
        yield restarts
        yield GaugeMetricFamily(
            "changefeed_ready", "1 when /readyz would say ready as far as the tail and draining "
            "go (Redis's PING is /readyz's own).",
            value=int(not tail_reasons(self.app)),
        )
        yield GaugeMetricFamily(
            "changefeed_draining", "1 after SIGTERM, while listeners are closed.",
            value=int(self.app[LIFECYCLE].draining),
        )
        yield GaugeMetricFamily(
            "changefeed_asyncio_tasks", "asyncio tasks of this process now (connections, long "
            "polls, background work): steady under a steady load, so a slope is a leak.",
            value=len(asyncio.all_tasks()),
        )

    def _outbox(self) -> Iterator[_Family]:
        """The PostgreSQL outbox's relay, when config.js has one."""
        relay = self.app.get(OUTBOX)
        if relay is not None:
            yield from outbox_metrics(relay.stats)
        capture = self.app.get(CAPTURE)
        if capture is not None:
            yield from capture_metrics(capture)


class Metrics:
    """The registry of one publisher, its live instruments and its `/metrics` route."""

    def __init__(self, app: web.Application, admission: Admission) -> None:
        self.registry = CollectorRegistry()
        self.activity = Activity()
        self.latency = Histogram(
            "changefeed_commit_to_write_seconds",
            "Seconds from a change's commit (its Redis time) to its write to listeners, once per "
            "item written (clocks of Redis and the publisher's host differ by their skew).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.requests = PromCounter(
            "changefeed_http_requests",
            "HTTP requests answered, by route (its pattern), method and status (101: websocket).",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.registry.register(_Collector(app, admission, self.activity))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)

    def count(self, request: web.Request, status: int) -> None:
        """Count `request`, answered with `status`, by route pattern (so ids do not make new
        series); publisher.web.edge calls it for every request."""
        info = request.match_info.route.resource
        route = info.canonical if info is not None else "unmatched"
        self.requests.labels(route, request.method, str(status)).inc()

    async def handle(self, request: web.Request) -> web.Response:
        """The text format, or OpenMetrics when the scraper asks for it (`Accept`)."""
        started = time.perf_counter()
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encode(self.registry)
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        response.headers["X-Scrape-Seconds"] = f"{time.perf_counter() - started:.4f}"
        return response


METRICS = web.AppKey("metrics", Metrics)


async def handle_metrics(request: web.Request) -> web.Response:
    """`GET /metrics`: the registry of the application's `Metrics`."""
    return await request.app[METRICS].handle(request)


routes = [web.get("/metrics", handle_metrics)]


__all__ = ["LATENCY_BUCKETS", "METRICS", "Activity", "Metrics", "package_version", "routes"]
