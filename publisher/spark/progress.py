"""What a write did, as figures: the sink's own metrics, which Spark has no place for.

PySpark's Python Data Source API gives a sink no custom metrics and no name of its own in a
streaming query's progress (docs/spark.md, "Monitoring", says where in PySpark and why). So the
figures of each write are logged by its commit (`spark write committed`, `spark micro-batch
committed`), and a streaming query's are also kept in its ledger, beside the span each micro-batch
committed, where `committed_batches` reads them back by batch id::

    batches = committed_batches(query, redisUrl=url, bucket="test")
    batches[query.lastProgress["batchId"]].figures   # Figures(changes_written=..., ...)

A ledger entry (``{bucket}:spark:<query>``, field = the batch id) is one line of text::

    <count> <first cursor> <last cursor> changes_written=<n> chunks_written=<n>
        chunks_skipped=<n> changes_skipped=<n> redis_ms=<n>
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Protocol

from changefeed.errors import OptionError
from publisher.spark.log import with_bucket
from publisher.spark.options import target_of


@dataclass(frozen=True, slots=True)
class Figures:
    """The sink's metrics of one write (a batch job, or a micro-batch of a stream)."""

    changes_written: int = 0
    """Changes sent to the bucket by this run."""
    chunks_written: int = 0
    """Chunks (one atomic commit of `batchSize` changes each) sent by this run."""
    chunks_skipped: int = 0
    """Chunks found already committed by an earlier attempt (their idempotency keys), not sent."""
    changes_skipped: int = 0
    """The changes of those chunks."""
    redis_seconds: float = 0.0
    """Time the tasks waited for Redis (sending chunks and reading the answers), summed."""

    def log_fields(self) -> dict[str, object]:
        """The figures as the fields of a log line."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class CommittedBatch:
    """A micro-batch of a streaming query as its ledger recorded it when it committed."""

    batch: int
    count: int
    """The changes of the micro-batch in the log (whichever attempt committed them)."""
    first: str | None
    """The cursor of its first change (None when it had none)."""
    last: str | None
    figures: Figures | None
    """What the run that committed it did (None in entries of versions that kept no figures)."""


def ledger_entry(count: int, first: str | None, last: str | None, figures: Figures) -> str:
    """The ledger's text for a micro-batch that committed `count` changes, from cursor `first`
    to `last`, with `figures`."""
    return (
        f"{count} {first} {last} changes_written={figures.changes_written} "
        f"chunks_written={figures.chunks_written} chunks_skipped={figures.chunks_skipped} "
        f"changes_skipped={figures.changes_skipped} "
        f"redis_ms={round(figures.redis_seconds * 1000)}"
    )


def parse_entry(batch: int, text: str) -> CommittedBatch:
    """A ledger entry read back (the figures are None in entries written without them)."""
    count, first, last, *named = text.split(" ")
    values = dict(pair.partition("=")[::2] for pair in named)
    figures = None
    if values:
        known = {f.name for f in fields(Figures)} - {"redis_seconds"}
        figures = Figures(
            **{name: int(values[name]) for name in known if name in values},
            redis_seconds=int(values.get("redis_ms", 0)) / 1000,
        )
    return CommittedBatch(
        batch, int(count), None if first == "None" else first,
        None if last == "None" else last, figures,
    )


class _NamedQuery(Protocol):
    @property
    def name(self) -> str | None: ...


def committed_batches(query: str | _NamedQuery, **options: str) -> dict[int, CommittedBatch]:
    """The micro-batches of streaming query `query` (a StreamingQuery, or its name) that its
    ledger holds (the last 1,000), by batch id, with their figures.

    `options` name the bucket as the data source's do: `config`, or `redisUrl` and `bucket`.

        progress = query.lastProgress
        committed_batches(query, config="config.js")[progress["batchId"]].figures
    """
    name = query if isinstance(query, str) else query.name
    if not name:
        raise OptionError(
            "queryName", None, "the name of the query (started with queryName(...))"
        )
    entries = with_bucket(target_of(options), lambda bucket: bucket.ledgers.ledger(name))
    return {batch: parse_entry(batch, text) for batch, text in sorted(entries.items())}
