"""The relay's Prometheus metric families, for the publisher's `/metrics` (publisher.web.metrics
yields them when the publisher relays an outbox)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from publisher.outbox.relay import RelayStats


def metric_families(stats: RelayStats) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    yield GaugeMetricFamily(
        "changefeed_outbox_relaying", "1 while this publisher holds the outbox relay lock.",
        value=int(stats.relaying),
    )
    yield GaugeMetricFamily(
        "changefeed_outbox_listening", "1 while the relay's LISTEN connection is up.",
        value=int(stats.listening),
    )
    yield CounterMetricFamily(
        "changefeed_outbox_relayed", "Outbox rows this publisher relayed into the bucket.",
        value=stats.relayed,
    )
    yield CounterMetricFamily(
        "changefeed_outbox_dead", "Outbox rows this publisher moved to outbox_dead.",
        value=stats.dead,
    )
    yield CounterMetricFamily(
        "changefeed_outbox_reseeds", "Re-seeds of the store from PostgreSQL.", value=stats.reseeds,
    )
    errors = CounterMetricFamily(
        "changefeed_outbox_errors", "Relay failures, by side.", labels=["side"]
    )
    errors.add_metric(["postgres"], stats.postgres_errors)
    errors.add_metric(["bucket"], stats.bucket_errors)
    yield errors
    status = stats.status
    if status is not None:  # as last read by the relaying publisher (every few seconds)
        yield GaugeMetricFamily(
            "changefeed_outbox_backlog", "Outbox rows waiting to be relayed.",
            value=status.backlog,
        )
        yield GaugeMetricFamily(
            "changefeed_outbox_oldest_age_seconds",
            "Age of the oldest outbox row waiting (0: none).", value=status.oldest_age or 0.0,
        )
        yield GaugeMetricFamily(
            "changefeed_outbox_dead_rows", "Rows in changefeed.outbox_dead.", value=status.dead,
        )
