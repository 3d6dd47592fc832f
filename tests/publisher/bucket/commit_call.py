"""commit.lua's KEYS and ARGV for a client that passes them one by one (a synchronous client,
redis-benchmark), and the cursors of its reply: for tests and the benchmarks, which commit
outside the bucket's own commit path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from changefeed.cursor import Position
from publisher.bucket import Change, ChangeBucket, encode_change
from publisher.bucket.values.changes import pack_changes


def commit_arguments(
    bucket: ChangeBucket, changes: Sequence[Change], key: str | None = None
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of commit.lua for `changes` (validated) on an ordered bucket, under
    idempotency `key`, as the bucket's next commit would send them."""
    for change in changes:
        bucket.log.validate(change)
    packed = pack_changes([encode_change(change) for change in changes])
    return bucket.log.ordered_shard().commits.arguments(packed, key)


def cursors_of(reply: bytes) -> list[str]:
    """The cursors of commit.lua's reply '<epoch> <ms> <first seq> <count> ...'."""
    epoch, ms, first, count = reply.split()[:4]
    return Position.run(epoch.decode(), int(ms), int(first), int(count))
