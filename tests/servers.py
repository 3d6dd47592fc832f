"""The real-server helpers of the tests, re-exported: their home is changefeed_testing.servers
(shared with the testing kit's pytest plugin), and how a child that is to stop on SIGINT is
started."""

import signal

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


def default_sigint() -> None:
    """A child's `preexec_fn`: SIGINT's default action, which Python turns into
    KeyboardInterrupt. A suite started in the background of a script (`nohup ... &`: SIGINT
    ignored, as some CI runners start jobs) would otherwise hand its children an ignored SIGINT,
    and a test's Ctrl-C would not reach them."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


__all__ = [
    "TIMEOUT_FACTOR",
    "PublisherProcess",
    "RedisCluster",
    "RedisServer",
    "SentinelServer",
    "default_sigint",
    "drain",
    "eventually",
    "free_port",
    "redis_binary",
    "scaled",
    "write_config",
]
