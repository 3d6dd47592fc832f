"""The listener's public surface is `listener/__init__.py`'s `__all__`, and only that."""

from __future__ import annotations

import inspect

import listener


def test_all_is_sorted_and_complete() -> None:
    assert listener.__all__ == sorted(listener.__all__)
    exported = {name for name in dir(listener)
                if not name.startswith("_") and not inspect.ismodule(getattr(listener, name))}
    assert exported == set(listener.__all__)


def test_exported_members() -> None:
    assert listener.__all__ == [
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


def test_errors_share_the_package_hierarchy() -> None:
    from changefeed.errors import ChangefeedError

    for name in listener.__all__:
        member = getattr(listener, name)
        if isinstance(member, type) and name.endswith(("Error", "Rejected", "Exhausted",
                                                       "Failed", "Lost", "Overflow",
                                                       "Unavailable", "Missed", "Option")):
            assert issubclass(member, ChangefeedError), name
