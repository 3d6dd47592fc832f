"""Every exception of the project, in one hierarchy.

    ChangefeedError
    ├── ConfigError                a config.js key is missing, unknown or wrong (.key, .value,
    │   │                          .expected)
    │   └── OptionError            a Spark data source option is wrong (same attributes)
    ├── CursorError                a cursor string is malformed (.cursor)
    ├── ChangeError                a change names an unknown resource or sub-resource, or a bad id;
    │                              or an idempotency key comes back with other changes
    ├── BucketUnavailable          Redis cannot be reached; nothing was sent or written (.cause)
    │   ├── CommitOutcomeUnknown   a commit was sent but no answer came: it may have been written;
    │   │                          retry it with the same idempotency key (.cause)
    │   ├── EpochNotRead           Redis holds an epoch this publisher's tail has not read yet: a
    │   │                          registration is refused until it has; try again shortly
    │   └── BucketBusy             no connection of the publisher's Redis pool came free in time:
    │                              the publisher is overloaded, Redis may be fine (HTTP 503)
    ├── ReplicationTimeout         a commit is written and acknowledged on the master, but fewer
    │                              replicas than asked confirmed it in time (.cursors, .replicas,
    │                              .acknowledged)
    ├── PartitionMismatch          the bucket was created with another partition count
    ├── ListenFailed               the publisher could not open its listening socket (.host,
    │                              .port, .cause)
    ├── RegistrationError          a websocket registration was refused (.close_code, .reason)
    ├── ProtocolError              a peer sent a frame that is not of the protocol; the listener
    │                              retries
    ├── ParamError                 a pull request parameter is invalid (HTTP 400, JSON-RPC -32602)
    ├── CursorGone                 a feed cursor can no longer be followed: trimmed, or of another
    │                              bucket epoch (HTTP 410)
    ├── CursorSetsFull             a feed consumer already has its most cursor sets (.consumer,
    │                              .most; HTTP 409)
    ├── ConsumerExists             a durable consumer of that name exists with another
    │                              configuration (.name, .differences; HTTP 409)
    ├── NoSuchConsumer             no durable consumer has that name (.name; HTTP 404)
    ├── OutboxError                the PostgreSQL outbox could not be read or installed (.cause)
    │   ├── OutboxRowDead          an outbox row was moved to changefeed.outbox_dead (.row_id,
    │   │                          .reason)
    │   └── OutboxWaitTimeout      an outbox row was not relayed in time (.row_id, .pending)
    ├── CaptureError               the capture's logical replication failed, or its set-up (.cause)
    └── ListenerError              raised by the listener library
        ├── RegistrationRejected   the publisher refused the registration (.url, .close_code,
        │                          .reason); raised, not retried
        ├── AccessDenied           the publisher refused the credentials (HTTP 401) or their
        │                          scope or origin (403), on any route (.url, .status, .code);
        │                          raised, not retried
        ├── RetriesExhausted       the backoff's retry limit was reached (.attempts, .last)
        ├── FetchFailed            Listener.fetch could not get an object (.url, .status)
        ├── InvalidOption          a pull consumer option is out of range, or two exclusive ones
        │   (also a ValueError)    were given (.option, .value, .expected)
        ├── PullRejected           the publisher refused an `events` request (4xx): raised, not
        │                          retried (.url, .status, .code)
        ├── ItemsMissed            the pull consumer's cursor is older than the retained log, or
        │                          of another bucket epoch (.cursor, .oldest, .reason)
        ├── ConsumerRecreated      the durable consumer was created again under its name: items
        │                          may have been missed; raised once (.name, .before, .now)
        └── ConnectionFailed       one attempt failed; retried with backoff
            ├── ConnectionLost     could not connect, or the websocket closed (.url,
            │                      .close_code, .reason, .status)
            ├── BootstrapFailed    a bootstrap page could not be fetched (.url, .status)
            ├── BufferOverflow     more items waited than the buffer holds (.size)
            ├── BufferUnavailable  the listener's Redis buffer could not be reached (.cause)
            ├── PullFailed         an `events` request got no answer, or a 5xx (.url, .status)
            └── HeartbeatMissed    a pull consumer heard nothing for twice its idle heartbeat;
                                   reported, then it pulls again (.url, .seconds)

Errors of dependencies are translated into these in exactly one place per dependency and side:
redis-py in `publisher.bucket` (and `listener.buffer`), asyncpg in `publisher.outbox.database`,
psycopg2 in `publisher.capture.database`, websockets and aiohttp's client in `listener.connection`
and `listener.consumer`. `changefeed.retry.is_retryable` decides if a listener failure is retried.
"""

from __future__ import annotations

import json
import os
from typing import Any


class ChangefeedError(Exception):
    """Base class of every error raised by the publisher and the listener."""


class ConfigError(ChangefeedError):
    """config.js (or a command-line override) is invalid.

    The message names the key, the value found and what was expected.
    """

    def __init__(self, key: str, value: Any, expected: str, said: str = "") -> None:
        self.key = key  # "<file>", said otherwise: the file itself is unreadable or not JS
        self.value = value
        self.expected = expected
        super().__init__(said or f"config key {key!r}: got {_js(value)}, expected {expected}")


def _js(value: Any) -> str:
    """`value` as config.js spells it: a string quoted, the rest as JSON (`true`, `null`)."""
    return repr(value) if isinstance(value, str) else json.dumps(value, default=repr)


class ListenFailed(ChangefeedError):
    """The publisher could not listen on `host`:`port` (in use, not an address of the host,
    a privileged port)."""

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        self.host = host
        self.port = port
        self.cause = cause
        why = os.strerror(cause.errno).lower() if cause.errno else str(cause)
        super().__init__(f"cannot listen on {host}:{port}: {why} (server.host, server.port)")


class CursorError(ChangefeedError):
    """A cursor string could not be decoded."""

    def __init__(self, cursor: str, why: str) -> None:
        self.cursor = cursor
        self.why = why
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


class EpochNotRead(BucketUnavailable):
    """Redis holds another epoch than the one this publisher's tail has read: the bucket lost
    its history and began again, and the tail has not read that yet (its reads are late, or
    it is catching up). A registration can be served neither from the old history, which is
    gone, nor from the new one until the tail has read it, so it is refused: try again shortly,
    or on another publisher. Nothing was committed."""


class BucketBusy(BucketUnavailable):
    """Every connection of the publisher's Redis pool stayed busy for `bucket.poolTimeout`: the
    publisher is overloaded. Redis itself may be fine; nothing was committed."""


class ReplicationTimeout(ChangefeedError):
    """`commit(..., replicas=N)`: the commit IS written on the master (its `cursors` are valid and
    listeners get it), but fewer than `replicas` replicas confirmed it (`acknowledged` did)
    within the timeout. It is lost if the master fails before a replica has it.

    Not an outcome-unknown error: nothing needs to be written again. Committing again with the
    same idempotency key returns the same cursors and waits for the replicas again.
    """

    def __init__(
        self, message: str, cursors: list[str], replicas: int, acknowledged: int
    ) -> None:
        self.cursors = cursors
        self.replicas = replicas
        self.acknowledged = acknowledged
        super().__init__(message)


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


class ParamError(ChangefeedError):
    """A request parameter is invalid; the message names it (a 400, or JSON-RPC -32602)."""


class CursorGone(ChangefeedError):
    """A cursor can no longer be followed (trimmed, or of another bucket epoch): HTTP 410."""


class CursorSetsFull(ChangefeedError):
    """A feed consumer asked to store a new cursor set while it has `most` of them already."""

    def __init__(self, consumer: str, most: int) -> None:
        self.consumer = consumer
        self.most = most
        super().__init__(
            f"consumer {consumer!r} already has {most} cursor sets (feed.maxCursorSets): reuse "
            "one, or wait until an unused one expires (feed.cursorSetMaxAge)"
        )


class ConsumerExists(ChangefeedError):
    """A durable consumer named `name` exists with another configuration, fixed when it was
    created: `differences` names each key that differs (delete it first to change it)."""

    def __init__(self, name: str, differences: list[str]) -> None:
        self.name = name
        self.differences = differences
        super().__init__(
            f"durable consumer {name!r} exists with another configuration: "
            f"{'; '.join(differences)} (its configuration is fixed when it is created: delete "
            "it to create it anew)"
        )


class NoSuchConsumer(ChangefeedError):
    """No durable consumer named `name` exists (never created, or deleted)."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"no durable consumer {name!r}: create it first (PUT)")


class OutboxError(ChangefeedError):
    """The PostgreSQL outbox could not be read, written or installed (`cause`: the driver's
    error, if one)."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class CaptureError(ChangefeedError):
    """The capture could not read or set up PostgreSQL's logical replication (`cause`)."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class OutboxRowDead(OutboxError):
    """Outbox row `row_id` was moved to changefeed.outbox_dead: it is never relayed."""

    def __init__(self, row_id: int, reason: str) -> None:
        super().__init__(f"outbox row {row_id} is dead: {reason}")
        self.row_id = row_id
        self.reason = reason


class OutboxWaitTimeout(OutboxError):
    """Outbox row `row_id` did not reach the bucket in time. `pending`: it is still in the
    outbox (False: not visible at all: its transaction rolled back or is not committed yet, or
    its cursor was forgotten, `outbox.keepRelayed`)."""

    def __init__(self, row_id: int, pending: bool, timeout: float) -> None:
        what = "still waits in the outbox" if pending else (
            "is not in the outbox: its transaction rolled back or has not committed, "
            "or its cursor was forgotten (outbox.keepRelayed)"
        )
        super().__init__(f"outbox row {row_id} {what} after {timeout:g} s")
        self.row_id = row_id
        self.pending = pending


class OptionError(ConfigError):
    """A data source option is missing, unknown or of the wrong kind (.key, .value)."""

    def __init__(self, key: str, value: Any, expected: str) -> None:
        super().__init__(key, value, expected)
        self.args = (f"changefeed option {key!r}: got {value!r}, expected {expected}",)



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


class AccessDenied(ListenerError):
    """The publisher answered 401 (no token, or one it does not know or that expired) or 403
    (a scope or origin it refuses) at the websocket upgrade, a bootstrap page, a fetch or a pull.

    The same credentials would be refused again, so it is raised to the application.
    """

    def __init__(self, url: str, status: int, code: str = "", message: str = "") -> None:
        self.url = url
        self.status = status
        self.code = code
        self.message = message
        what = "credentials" if status == 401 else "request"
        detail = f" {code}: {message}" if code else ""
        super().__init__(f"{url} refused the {what} with HTTP {status}{detail}")


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


class InvalidOption(ListenerError, ValueError):
    """A pull consumer option is out of range, or conflicts with another (ADR-37's rules)."""

    def __init__(self, option: str, value: object, expected: str) -> None:
        self.option = option
        self.value = value
        self.expected = expected
        super().__init__(f"option {option}={value!r}: expected {expected}")


class PullRejected(ListenerError):
    """The publisher answered an `events` request with a 4xx: the same request would be refused
    again (bad parameters, or a publisher without the `events` endpoint), so it is raised."""

    def __init__(self, url: str, status: int, code: str, message: str) -> None:
        self.url = url
        self.status = status
        self.code = code
        self.message = message
        super().__init__(f"{url} refused the pull with HTTP {status} {code}: {message}")


class ItemsMissed(ListenerError):
    """Items after `cursor` are gone: it is older than the retained log (trimmed), or of another
    bucket epoch. `oldest` is the oldest cursor still available ('' when the log is empty).

    The application decides: resynchronise its view from the source, or accept the gap and pull
    again with ``after=None`` (from the oldest retained item).
    """

    def __init__(self, cursor: str | None, oldest: str, reason: str = "") -> None:
        self.cursor = cursor
        self.oldest = oldest
        self.reason = reason
        why = f" ({reason})" if reason else ""
        super().__init__(
            f"items after cursor {cursor!r} were missed{why}; oldest available: {oldest!r}"
        )


class ConsumerRecreated(ListenerError):
    """The durable consumer `name` this instance used is gone and a new one of that name was
    created (its state was lost with Redis's, or it was deleted): items committed meanwhile may
    never be handed out, and the new one hands items out from its `start`. Raised once, by the
    fetch after the instance met the new consumer; fetching again goes on with it. The
    application decides, as on ItemsMissed: resynchronise from the source, or accept the gap."""

    def __init__(self, name: str, before: str, now: str) -> None:
        self.name = name
        self.before = before
        self.now = now
        super().__init__(
            f"durable consumer {name!r} was created again (incarnation {now}; this instance "
            f"used {before}): items may have been missed"
        )


class PullFailed(ConnectionFailed):
    """An `events` request failed in a way a later one may not: the publisher could not be
    reached, the connection broke, or it answered 5xx (`status`; 503: its Redis is down)."""

    def __init__(self, url: str, why: str, status: int | None = None) -> None:
        self.url = url
        self.status = status
        super().__init__(f"pull from {url}: {why}")


class HeartbeatMissed(ConnectionFailed):
    """No answer of any kind came for `seconds` (twice the idle heartbeat) while a pull was
    pending: the publisher is stuck or the network dropped. Reported, not fatal (ADR-37)."""

    def __init__(self, url: str, seconds: float) -> None:
        self.url = url
        self.seconds = seconds
        super().__init__(f"no answer from {url} for {seconds:g} s (missed heartbeats)")


__all__ = [
    "AccessDenied",
    "BootstrapFailed",
    "BucketBusy",
    "BucketUnavailable",
    "BufferOverflow",
    "BufferUnavailable",
    "ChangeError",
    "ChangefeedError",
    "CommitOutcomeUnknown",
    "ConfigError",
    "ConnectionFailed",
    "ConnectionLost",
    "ConsumerExists",
    "ConsumerRecreated",
    "CursorError",
    "CursorGone",
    "CursorSetsFull",
    "EpochNotRead",
    "FetchFailed",
    "HeartbeatMissed",
    "InvalidOption",
    "ItemsMissed",
    "ListenFailed",
    "ListenerError",
    "NoSuchConsumer",
    "OptionError",
    "OutboxError",
    "OutboxRowDead",
    "OutboxWaitTimeout",
    "ParamError",
    "PartitionMismatch",
    "ProtocolError",
    "PullFailed",
    "PullRejected",
    "RegistrationError",
    "RegistrationRejected",
    "ReplicationTimeout",
    "RetriesExhausted",
]
