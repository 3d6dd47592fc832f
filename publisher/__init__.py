"""The change-feed publisher: commit changes to the bucket, and serve them to listeners.

The public surface is what `__all__` lists; tests/publisher/test_exported_members.py pins it.
"""

from importlib.metadata import version as _distribution_version
from typing import TYPE_CHECKING

from changefeed.backoff import Backoff
from changefeed.cursor import Cursor
from changefeed.errors import (
    BucketUnavailable,
    ChangeError,
    ChangefeedError,
    CommitOutcomeUnknown,
    ConfigError,
    CursorError,
    PartitionMismatch,
    ProtocolError,
    RegistrationError,
    ReplicationTimeout,
)
from changefeed.protocol import ChangeItem, ChangeKind, CloseCode, Registration, Resource
from changefeed.watch import Watch
from publisher.bucket import Change, ChangeBucket, connect
from publisher.config.settings import Config, load_config, parse_config

if TYPE_CHECKING:
    from publisher.server.service import Service

__version__ = _distribution_version("changefeed")

__all__ = [
    "Backoff",
    "BucketUnavailable",
    "Change",
    "ChangeBucket",
    "ChangeError",
    "ChangeItem",
    "ChangeKind",
    "ChangefeedError",
    "CloseCode",
    "CommitOutcomeUnknown",
    "Config",
    "ConfigError",
    "Cursor",
    "CursorError",
    "PartitionMismatch",
    "ProtocolError",
    "Registration",
    "RegistrationError",
    "ReplicationTimeout",
    "Resource",
    "Service",
    "Watch",
    "connect",
    "load_config",
    "parse_config",
]


def __getattr__(name: str) -> object:
    """`Service` (the HTTP server and all it needs) is imported when first asked for: the Python
    workers of a Spark job import `publisher.spark` and the bucket, and never serve."""
    if name == "Service":
        from publisher.server.service import Service

        return Service
    raise AttributeError(f"module 'publisher' has no attribute {name!r}")
