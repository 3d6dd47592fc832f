"""The real-server helpers of the tests, re-exported: their home is changefeed_testing.servers
(shared with the testing kit's pytest plugin)."""

from changefeed_testing.servers import (
    TIMEOUT_FACTOR,
    PublisherProcess,
    RedisCluster,
    RedisServer,
    SentinelServer,
    drain,
    eventually,
    free_port,
    redis_binary,
    scaled,
    write_config,
)

__all__ = [
    "TIMEOUT_FACTOR",
    "PublisherProcess",
    "RedisCluster",
    "RedisServer",
    "SentinelServer",
    "drain",
    "eventually",
    "free_port",
    "redis_binary",
    "scaled",
    "write_config",
]
