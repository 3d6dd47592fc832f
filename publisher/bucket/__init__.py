"""The change bucket and the authoritative store, in Redis.

    keys.py      the key layout of a bucket (`Keys`) and the partition of a change
    values.py    what goes in and comes out: `Change`, `LogEntry`, `StatePage`, `Committed`, ...
    markers.py   the keyset marker of bootstrap pages
    scripts.py   the Lua scripts (`*.lua` beside it), loaded with importlib.resources
    client.py    `ChangeBucket` and `connect`: the commit path, the reads and the tail
    translate.py `translate_redis_errors`: the one place where redis-py's errors become ours
    fleet.py, ledgers.py, cursor_sets.py, durable.py
                 small stores of bucket-wide keys: the fleet's reports (`bucket.fleet`), the
                 Spark ledgers (`bucket.ledgers`), the feed's cursor sets (`bucket.cursor_sets`),
                 the durable consumers (`DurableStore`)

This module re-exports what the rest of the tree uses.
"""

from publisher.bucket.client import (
    BATCH,
    IDEMPOTENCY_KEYS,
    REPLICAS_TIMEOUT,
    TRIM_BATCH,
    Batch,
    ChangeBucket,
    EncodedBatch,
    KeyOf,
    StreamStats,
    connect,
    translate_redis_errors,
)
from publisher.bucket.cluster import ClusterBucket  # also what ChangeBucket over a cluster is
from publisher.bucket.keys import Keys, partition_of
from publisher.bucket.markers import decode_marker, encode_marker
from publisher.bucket.scripts import COMMIT
from publisher.bucket.values import (
    MAX_ID_BYTES,
    Change,
    Committed,
    Encoded,
    LogEntry,
    LogRead,
    Op,
    Piece,
    Retention,
    StatePage,
    digest_of,
    encode_change,
    merge_partitions,
    parse_entry,
)

COMMIT_LUA = COMMIT.text
"""The commit script's text, for a test that must commit with a synchronous client."""

__all__ = [
    "BATCH",
    "COMMIT_LUA",
    "IDEMPOTENCY_KEYS",
    "MAX_ID_BYTES",
    "REPLICAS_TIMEOUT",
    "TRIM_BATCH",
    "Batch",
    "Change",
    "ChangeBucket",
    "ClusterBucket",
    "Committed",
    "Encoded",
    "EncodedBatch",
    "KeyOf",
    "Keys",
    "LogEntry",
    "LogRead",
    "Op",
    "Piece",
    "Retention",
    "StatePage",
    "StreamStats",
    "connect",
    "decode_marker",
    "digest_of",
    "encode_change",
    "encode_marker",
    "merge_partitions",
    "parse_entry",
    "partition_of",
    "translate_redis_errors",
]
