"""The change bucket and the authoritative store, in Redis.

    keys.py       the key layout of a bucket or shard (`Keys`) and the partition of a change
    values.py     what goes in and comes out: `Change`, `LogEntry`, `StatePage`, `Committed`, ...
    vector.py     a position in every shard (`Vector`): what a cursor names
    markers.py    the keyset marker of bootstrap pages
    scripts.py    the Lua scripts (`*.lua` beside it), loaded with importlib.resources
    connection.py `connect` (any Redis URL) and the one place where redis-py's errors become ours
    commits.py    one shard's commit path (`Committer`): commit.lua calls, single or streamed
    shard.py      `Shard`: one slot-local log with one id sequence (tail, reads, trim, pages)
    layout.py     which shards a bucket has: the one place that tells a Redis Cluster apart
    core.py, writes.py, reads.py, client.py
                  `ChangeBucket` (its shards and epoch, its commit path, its reads) and
                  `open_bucket`
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
    Batch,
    ChangeBucket,
    EncodedBatch,
    KeyOf,
    StreamStats,
    open_bucket,
)
from publisher.bucket.connection import connect, translate_redis_errors
from publisher.bucket.keys import Keys, partition_of
from publisher.bucket.markers import decode_marker, encode_marker
from publisher.bucket.scripts import COMMIT
from publisher.bucket.shard import TRIM_BATCH, Shard
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
    object_state,
    parse_entry,
    state_refused,
)
from publisher.bucket.vector import Vector, decode_vector, parse_vector

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
    "Shard",
    "StatePage",
    "StreamStats",
    "Vector",
    "connect",
    "decode_marker",
    "decode_vector",
    "digest_of",
    "encode_change",
    "encode_marker",
    "merge_partitions",
    "object_state",
    "open_bucket",
    "parse_entry",
    "parse_vector",
    "partition_of",
    "state_refused",
    "translate_redis_errors",
]
