"""The change-feed listener (RFD 5): register, bootstrap while buffering, resume, back off.

    resources = {"vm": ["nic", "alias"]}
    async with Listener(url, instance=..., service="tcns", resources=resources) as feed:
        async for event in feed:  # bootstrap pages first, then live changes
            ...

To hear about some objects only, add `watches={"vm": Watch.of(ids=[...], prefixes=[...])}`.

The pull consumer (JetStream ADR-37 over the publisher's `events` long poll):

    async with PullConsumer(url, resource="vm", after=saved_cursor) as consumer:
        async for item in consumer.consume(max_messages=100):
            ...  # then store consumer.cursor

A durable consumer (JetStream's): the publisher keeps its position, acknowledgements move it:

    async with DurableConsumer(url, "billing", resource="vm", ack_wait=30) as consumer:
        async for msg in consumer.consume():
            ...  # then await msg.ack()

docs/listener.md describes the events, the settings and the failure handling.
"""

from importlib.metadata import version as _distribution_version

from changefeed.backoff import Backoff
from changefeed.durable import Settled
from changefeed.errors import (
    BootstrapFailed,
    BufferOverflow,
    BufferUnavailable,
    ConnectionFailed,
    ConnectionLost,
    ConsumerRecreated,
    FetchFailed,
    HeartbeatMissed,
    InvalidOption,
    ItemsMissed,
    ListenerError,
    PullFailed,
    PullRejected,
    RegistrationRejected,
    RetriesExhausted,
)
from changefeed.protocol import ChangeItem
from changefeed.watch import Watch
from listener.buffer import Buffer, MemoryBuffer
from listener.client import Listener
from listener.config import (
    BufferConfig,
    ListenerConfig,
    load_listener_config,
    parse_listener_config,
)
from listener.consumer import Consumption, PullConsumer
from listener.consumer_state import ConsumeState
from listener.durable import DurableConsumer, Msg
from listener.events import (
    BootstrapDone,
    BootstrapRecords,
    BootstrapStart,
    Change,
    Event,
    Resync,
)
from listener.pager import LinkHeaderPager, OffsetPager, Page, Pager, PublisherPager
from listener.state import Phase

__version__ = _distribution_version("changefeed")

__all__ = [
    "Backoff",
    "BootstrapDone",
    "BootstrapFailed",
    "BootstrapRecords",
    "BootstrapStart",
    "Buffer",
    "BufferConfig",
    "BufferOverflow",
    "BufferUnavailable",
    "Change",
    "ChangeItem",
    "ConnectionFailed",
    "ConnectionLost",
    "ConsumeState",
    "ConsumerRecreated",
    "Consumption",
    "DurableConsumer",
    "Event",
    "FetchFailed",
    "HeartbeatMissed",
    "InvalidOption",
    "ItemsMissed",
    "LinkHeaderPager",
    "Listener",
    "ListenerConfig",
    "ListenerError",
    "MemoryBuffer",
    "Msg",
    "OffsetPager",
    "Page",
    "Pager",
    "Phase",
    "PublisherPager",
    "PullConsumer",
    "PullFailed",
    "PullRejected",
    "RedisBuffer",
    "RegistrationRejected",
    "Resync",
    "RetriesExhausted",
    "Settled",
    "Watch",
    "load_listener_config",
    "parse_listener_config",
]


def __getattr__(name: str) -> object:
    """`RedisBuffer` is imported on first use, so that `import listener` needs no redis-py."""
    if name == "RedisBuffer":
        from listener.redis_buffer import RedisBuffer

        return RedisBuffer
    raise AttributeError(f"module 'listener' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "RedisBuffer"])
