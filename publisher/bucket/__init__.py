"""The change bucket and the authoritative store, in Redis.

    client.py     `ChangeBucket`, the service author's face (commit, commit_many, publish, get,
                  page, wait_for_replicas, aclose), and `open_bucket`
    log/          the log over the bucket's shards, a single Redis being one shard: `Log`
                  (log.py: tail, reads, trim, epoch, pages: what the publisher uses, as
                  `ChangeBucket.log`), its commits (writes.py), a shard (shard.py) and its
                  commit path (commits.py), which shards a bucket has (layout.py)
    values/       pure values: changes, log entries, pages and commits (changes.py), the key
                  layout (keys.py), positions (vector.py), bootstrap markers (markers.py), the
                  check of a change against the resources (validation.py)
    stores/       small stores of bucket-wide keys: the fleet's reports, the Spark ledgers, the
                  feed's cursor sets, the durable consumers
    redis/        the transport: `connect` (any Redis URL) and the one place where redis-py's
                  errors become ours (connection.py), a kept connection (channel.py), RESP
                  (resp.py), Sentinel, Redis Cluster URLs and routing, the embedded server
    lua/          the Lua scripts (`*.lua`), loaded with importlib.resources (scripts.py)

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
from publisher.bucket.log.log import Log
from publisher.bucket.log.shard import TRIM_BATCH, Shard
from publisher.bucket.lua.scripts import COMMIT
from publisher.bucket.redis.connection import connect, translate_redis_errors
from publisher.bucket.values.changes import (
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
from publisher.bucket.values.keys import Keys, partition_of
from publisher.bucket.values.markers import decode_marker, encode_marker
from publisher.bucket.values.vector import Vector, decode_vector

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
    "Log",
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
    "partition_of",
    "state_refused",
    "translate_redis_errors",
]
