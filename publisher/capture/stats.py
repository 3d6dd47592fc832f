"""What the capture shows of itself: `CaptureStats` (in `/changefeeds/stats` and
`changefeed capture status`) and its Prometheus metric families (in `/metrics`). Imports no
PostgreSQL driver: the web side reads it whatever is installed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from publisher.capture.pgoutput import format_lsn


@dataclass(slots=True)
class CaptureStats:
    """What `/metrics`, `/changefeeds/stats` and `changefeed capture status` show."""

    streaming: bool = False
    """This publisher holds the capture's lock (it copies or streams the slot)."""
    transactions: int = 0
    rows: int = 0
    set_aside: int = 0
    copies: int = 0
    postgres_errors: int = 0
    bucket_errors: int = 0
    lag_bytes: int | None = None
    """pg_current_wal_lsn() minus the slot's confirmed position (None: not read yet)."""
    lag_seconds: float = 0.0
    """Seconds from the last applied transaction's COMMIT to the bucket's acknowledgment."""
    confirmed_lsn: int = 0
    ddl: list[str] = field(default_factory=list)
    """The newest DDL reports (a mapped column gone or retyped; fitting again)."""

    def failed(self, side: str) -> None:
        """One failure of `side`: "postgres" or "bucket"."""
        if side == "postgres":
            self.postgres_errors += 1
        else:
            self.bucket_errors += 1

    def stream(self, holding: bool) -> None:
        """This publisher took (True) or left (False) the capture's lock."""
        self.streaming = holding

    def copied(self) -> None:
        self.copies += 1

    def applied(self, transactions: int, rows: int, lag_seconds: float, lsn: int) -> None:
        """A group of transactions the bucket acknowledged, the last at `lsn`."""
        self.transactions += transactions
        self.rows += rows
        self.lag_seconds = lag_seconds
        self.confirmed_lsn = lsn

    def lagged(self, lag_bytes: int | None, confirmed: int) -> None:
        self.lag_bytes = lag_bytes
        self.confirmed_lsn = max(self.confirmed_lsn, confirmed)

    def reported(self, ddl: str, keep: int) -> None:
        """A DDL report, the newest `keep` of them kept."""
        self.ddl = [*self.ddl, ddl][-keep:]

    def aside(self, rows: int) -> None:
        self.set_aside += rows

    def report(self) -> dict[str, Any]:
        return {
            "streaming": self.streaming, "transactions": self.transactions, "rows": self.rows,
            "setAside": self.set_aside, "copies": self.copies,
            "postgresErrors": self.postgres_errors, "bucketErrors": self.bucket_errors,
            "lagBytes": self.lag_bytes, "lagSeconds": round(self.lag_seconds, 6),
            "confirmedLsn": format_lsn(self.confirmed_lsn), "ddl": list(self.ddl),
        }



def metric_families(stats: CaptureStats) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    yield GaugeMetricFamily(
        "changefeed_capture_streaming", "1 while this publisher holds the capture's lock.",
        value=int(stats.streaming),
    )
    yield CounterMetricFamily(
        "changefeed_capture_transactions", "PostgreSQL transactions committed into the bucket.",
        value=stats.transactions,
    )
    yield CounterMetricFamily(
        "changefeed_capture_rows", "Row changes committed into the bucket.", value=stats.rows,
    )
    yield CounterMetricFamily(
        "changefeed_capture_set_aside", "Row changes set aside (not committed), with a reason.",
        value=stats.set_aside,
    )
    yield CounterMetricFamily(
        "changefeed_capture_copies", "Copies of the mapped tables (first start, slot lost).",
        value=stats.copies,
    )
    errors = CounterMetricFamily(
        "changefeed_capture_errors", "Capture failures, by side.", labels=["side"]
    )
    errors.add_metric(["postgres"], stats.postgres_errors)
    errors.add_metric(["bucket"], stats.bucket_errors)
    yield errors
    if stats.lag_bytes is not None:
        yield GaugeMetricFamily(
            "changefeed_capture_lag_bytes",
            "pg_current_wal_lsn() minus the slot's confirmed position.", value=stats.lag_bytes,
        )
    yield GaugeMetricFamily(
        "changefeed_capture_lag_seconds",
        "Seconds from the last applied transaction's COMMIT to the bucket's acknowledgment.",
        value=stats.lag_seconds,
    )
