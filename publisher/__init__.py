"""The change-feed publisher: commit changes to the bucket, and serve them to listeners.

The public surface is what `__all__` lists; tests/publisher/test_exported_members.py pins it.
"""

from publisher.backoff import Backoff
from publisher.bucket import Change, ChangeBucket, connect
from publisher.config import Config, load_config, parse_config
from publisher.cursor import Cursor
from publisher.errors import (
    BucketUnavailable,
    ChangeError,
    ChangefeedError,
    ConfigError,
    CursorError,
    PartitionMismatch,
    ProtocolError,
    RegistrationError,
)
from publisher.protocol import ChangeItem, ChangeKind, CloseCode, Registration, Resource
from publisher.service import Service
from publisher.watch import Watch

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
    "Config",
    "ConfigError",
    "Cursor",
    "CursorError",
    "PartitionMismatch",
    "ProtocolError",
    "Registration",
    "RegistrationError",
    "Resource",
    "Service",
    "Watch",
    "connect",
    "load_config",
    "parse_config",
]
