"""The errors the listener raises, in the package's one hierarchy.

    ChangefeedError                     (publisher.errors)
    ├── ProtocolError                   a publisher sent a frame not of the protocol; retried
    └── ListenerError
        ├── RegistrationRejected        the publisher refused the registration
        │                               (.close_code, .reason); raised, not retried
        ├── RetriesExhausted            the backoff's retry limit was reached (.last)
        ├── FetchFailed                 Listener.fetch could not get an object (.url, .status)
        └── ConnectionFailed            one attempt failed; retried with backoff
            ├── ConnectionLost          could not connect, or the websocket closed
            │                           (.url, .close_code, .reason, .status)
            ├── BootstrapFailed         a bootstrap page could not be fetched (.url, .status)
            ├── BufferOverflow          more items waited than the buffer holds (.size)
            └── BufferUnavailable       the Redis buffer could not be reached (.cause)

Errors of websockets and aiohttp are translated into these in exactly one place
(`listener.connection.translate_errors`); errors of redis-py in `listener.buffer`.
Whether a failure is retried is decided by `listener.state.ListenerCore.failed`.
"""

from __future__ import annotations

from publisher.errors import ChangefeedError


class ListenerError(ChangefeedError):
    """Base class of the listener's errors."""


class RegistrationRejected(ListenerError):
    """The publisher closed the websocket in answer to the registration (1008, 1009, 1003).

    Retrying the same registration would be refused again, so the listener raises this to the
    application instead of reconnecting.
    """

    def __init__(self, url: str, close_code: int, reason: str) -> None:
        self.url = url
        self.close_code = close_code
        self.reason = reason
        super().__init__(f"{url} rejected the registration with {close_code}: {reason}")


class RetriesExhausted(ListenerError):
    """The backoff's `retries` limit was reached; `.last` is the last failure."""

    def __init__(self, attempts: int, last: BaseException) -> None:
        self.attempts = attempts
        self.last = last
        super().__init__(f"gave up after {attempts} failed attempts; last: {last}")


class FetchFailed(ListenerError):
    """`Listener.fetch` got neither the object nor a 404 (`status` is None when no response)."""

    def __init__(self, url: str, why: str, status: int | None = None) -> None:
        self.url = url
        self.status = status
        super().__init__(f"fetching {url}: {why}")


class ConnectionFailed(ListenerError):
    """One connection attempt failed in a way a later attempt may not: retried with backoff."""


class ConnectionLost(ConnectionFailed):
    """The publisher could not be reached, refused the upgrade, or the websocket closed.

    `close_code` is the code of the close frame received (1006 when none was), or None when no
    websocket was established; `status` the HTTP status when the upgrade was refused.
    """

    def __init__(
        self,
        url: str,
        why: str,
        close_code: int | None = None,
        reason: str = "",
        status: int | None = None,
    ) -> None:
        self.url = url
        self.close_code = close_code
        self.reason = reason
        self.status = status
        super().__init__(f"{url}: {why}")


class BootstrapFailed(ConnectionFailed):
    """A bootstrap page could not be fetched or parsed (`status` is None when no response)."""

    def __init__(self, url: str, why: str, status: int | None = None) -> None:
        self.url = url
        self.status = status
        super().__init__(f"bootstrap page {url}: {why}")


class BufferOverflow(ConnectionFailed):
    """More change items waited for the application than the buffer may hold (RFD 5: abort)."""

    def __init__(self, size: int) -> None:
        self.size = size
        super().__init__(f"buffer overflow: more than {size} change items waiting")


class BufferUnavailable(ConnectionFailed):
    """The Redis buffer could not be reached."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        self.cause = cause
        super().__init__(message)
