"""The testing kit: test listeners against a real Redis and a real publisher, never a mock.

- A pytest plugin (changefeed_testing.plugin, loaded through the `pytest11` entry point) with the
  fixtures `changefeed_redis`, `changefeed_publisher`, `changefeed_bucket`, `changefeed_faults`
  and `changefeed_settings`.
- Fault helpers (`Faults`): restart the publisher, pause Redis, trim the log past a cursor, put a
  slow socket (`SlowSocket`) between the listener and the publisher.
- The servers themselves (`RedisServer`, `PublisherProcess`, `RunningPublisher`) for other test
  runners.
- `changefeed conformance URL`: the RFD 5 protocol checks against any publisher
  (changefeed_testing.conformance).

The public surface is what `__all__` lists; tests/kit/test_exported_members.py pins it.
docs/testing.md is the guide.
"""

from changefeed_testing.faults import Faults
from changefeed_testing.proxy import SlowSocket
from changefeed_testing.running import RunningPublisher
from changefeed_testing.servers import (
    PublisherProcess,
    RedisServer,
    eventually,
    free_port,
    scaled,
    write_config,
)

__all__ = [
    "Faults",
    "PublisherProcess",
    "RedisServer",
    "RunningPublisher",
    "SlowSocket",
    "eventually",
    "free_port",
    "scaled",
    "write_config",
]
