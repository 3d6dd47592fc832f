"""Where a bucket's partitions live: the one place that decides it, from the client.

- A single Redis or a Sentinel-managed Redis (`redis://`, `rediss://`, `unix://`,
  `redis+sentinel://`): one shard, under the hash tag ``{name}``, holding every partition (they
  share one id sequence): an ordered bucket.
- A Redis Cluster (`redis+cluster://`, `bucket.cluster`): one shard per partition, under the hash
  tag ``{name/p}``, so each lands on the master of its slot; its commits go through the cluster
  client.

`publisher.bucket.client.open_bucket` makes the bucket of a URL or of a loaded config.
"""

from __future__ import annotations

from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from publisher.bucket.log.shard import Shard


def is_ordered(client: Any) -> bool:
    """True unless `client` is a Redis Cluster client (one shard per partition): the bucket's
    one shard holds every partition, so its items have one total order."""
    return not isinstance(client, RedisCluster)


def make_shards(
    client: aioredis.Redis, name: str, partitions: int | None, idempotency_keys: int,
    *, ordered: bool,
) -> list[Shard]:
    """The shards of bucket `name`: (`ordered`) one holding every partition, or `partitions`
    shards of one partition each."""
    if ordered:
        return [Shard(client, name, 0, partitions, idempotency_keys, direct=True)]
    return [
        Shard(client, f"{name}/{p}", p, 1, idempotency_keys, direct=False,
              what=f"commit (partition {p})")
        for p in range(partitions or 1)
    ]


class BucketSettings(Protocol):
    """What `open_bucket` reads of a config's `bucket` section (`publisher.config.Bucket`)."""

    @property
    def redis_url(self) -> str | None: ...
    @property
    def name(self) -> str: ...
    @property
    def partitions(self) -> int | None: ...
    @property
    def pool_size(self) -> int: ...


class Settings(Protocol):
    """What `open_bucket` reads of a loaded config (`publisher.config.Config`)."""

    @property
    def bucket(self) -> BucketSettings: ...
    @property
    def resources(self) -> Any: ...


__all__ = ["BucketSettings", "Settings", "is_ordered", "make_shards"]

