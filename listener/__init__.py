"""The change-feed listener (RFD 5): register, bootstrap while buffering, resume, back off.

    resources = {"vm": ["nic", "alias"]}
    async with Listener(url, instance=..., service="tcns", resources=resources) as feed:
        async for event in feed:  # bootstrap pages first, then live changes
            ...

docs/listener.md describes the events, the settings and the failure handling.
"""

from listener.buffer import Buffer, MemoryBuffer, RedisBuffer
from listener.client import Listener
from listener.config import (
    BufferConfig,
    ListenerConfig,
    load_listener_config,
    parse_listener_config,
)
from listener.errors import (
    BootstrapFailed,
    BufferOverflow,
    BufferUnavailable,
    ConnectionFailed,
    ConnectionLost,
    FetchFailed,
    ListenerError,
    RegistrationRejected,
    RetriesExhausted,
)
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
from publisher.backoff import Backoff
from publisher.protocol import ChangeItem

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
    "Event",
    "FetchFailed",
    "LinkHeaderPager",
    "Listener",
    "ListenerConfig",
    "ListenerError",
    "MemoryBuffer",
    "OffsetPager",
    "Page",
    "Pager",
    "Phase",
    "PublisherPager",
    "RedisBuffer",
    "RegistrationRejected",
    "Resync",
    "RetriesExhausted",
    "load_listener_config",
    "parse_listener_config",
]
