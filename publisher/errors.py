"""Every error this package raises, in one hierarchy.

    ChangefeedError
    ├── ConfigError            a config.js key is missing, unknown or wrong (.key, .value)
    ├── CursorError            a cursor string is malformed (.cursor)
    ├── ChangeError            a change names an unknown resource or sub-resource, or a bad id;
    │                          or an idempotency key comes back with other changes
    ├── BucketUnavailable      Redis cannot be reached; nothing was sent, nothing written (.cause)
    │   └── CommitOutcomeUnknown   a commit was sent but no answer came: it may have been
    │                              written; retry it with the same idempotency key (.cause)
    ├── PartitionMismatch      the bucket was created with another partition count
    ├── RegistrationError      a websocket registration was refused (.close_code, .reason)
    └── ProtocolError          a peer sent a frame that is not of the protocol

Errors of redis-py are translated into ours in exactly one place
(`publisher.bucket.client.translate_redis_errors`); nothing else catches them.
"""

from __future__ import annotations

from typing import Any


class ChangefeedError(Exception):
    """Base class of every error raised by the publisher and the listener."""


class ConfigError(ChangefeedError):
    """config.js (or a command-line override) is invalid.

    The message names the key, the value found and what was expected.
    """

    def __init__(self, key: str, value: Any, expected: str) -> None:
        self.key = key
        self.value = value
        self.expected = expected
        super().__init__(f"config key {key!r}: got {value!r}, expected {expected}")


class CursorError(ChangefeedError):
    """A cursor string could not be decoded."""

    def __init__(self, cursor: str, why: str) -> None:
        self.cursor = cursor
        super().__init__(f"invalid cursor {cursor!r}: {why}")


class ChangeError(ChangefeedError):
    """A change cannot be committed as given (unknown resource, bad id, ...)."""


class BucketUnavailable(ChangefeedError):
    """The change bucket (Redis) could not be reached. Nothing was committed.

    A commit that was sent but not answered raises the subclass `CommitOutcomeUnknown` instead,
    so `except BucketUnavailable` still sees every outage.
    """

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        self.cause = cause
        super().__init__(message)


class CommitOutcomeUnknown(BucketUnavailable):
    """A commit reached Redis, or may have, and no answer came (a timeout, a connection lost
    after sending): it may have been written, and delivered, or not.

    Commit again with the same idempotency key: that writes it if it was not, and returns its
    original cursor(s) if it was. Without a key, a retry may append the change twice.
    """


class PartitionMismatch(ChangefeedError):
    """The bucket in Redis was created with another partition count than configured.

    A bucket's partition count is fixed when it is created (the partition of a change decides
    which stream holds it); nothing was written.
    """


class RegistrationError(ChangefeedError):
    """A listener's registration was refused; the socket is closed with `close_code`."""

    def __init__(self, close_code: int, reason: str) -> None:
        self.close_code = close_code
        self.reason = reason
        super().__init__(f"{close_code}: {reason}")


class ProtocolError(ChangefeedError):
    """A frame received from a peer does not follow the change-feed protocol."""
