"""The admission of a listener's registration, one core for every transport (Sans-I/O).

The websocket (`publisher.web.websocket`) and server-sent events (`publisher.web.sse`) hand it
the facts as they learn them, and only carry out what it returns:

1. `check(frame, version, resources, access, tail_healthy)`: the registration parsed, the
   access checks' verdict on it (scopes, registration rate, listener cap: `Access`) and whether
   the tail reads: the `Registration`, or `Refused`;
2. the handler asks the hub where it starts (I/O), and gives `started(registration, outcome)`
   the answer or the exception: `Admitted(registration, start, resumed)`, or `Refused`.

`RULES` is the one table of refusals: each `Why` has its close code (what a websocket is
closed with) and its HTTP status and JSON code (what SSE and the pull routes answer instead);
`EXCEPTIONS` maps each exception of a registration or a pull request to its `Why`. The pull
handlers (publisher.web.poll_routes, durable_routes, the bootstrap routes' `min_cursor`) refuse
through the same `refused`/`refusal_of` and answer `publisher.web.http.refusal_response`.
docs/protocol.md#close-codes lists the close codes.
No sockets, no clocks: tests/publisher/web/test_registrations.py checks every refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from changefeed.errors import (
    BucketBusy,
    BucketUnavailable,
    ChangefeedError,
    CommitOutcomeUnknown,
    ConsumerExists,
    CursorError,
    CursorGone,
    CursorSetsFull,
    EpochNotRead,
    NoSuchConsumer,
    RegistrationError,
)
from changefeed.protocol import CloseCode, Registration, Resource, parse_registration
from publisher.bucket import Vector
from publisher.web import http
from publisher.web.http import BUCKET_ANSWERS


class Why(StrEnum):
    """Every reason a registration is refused (the value: its count in /changefeeds/stats)."""

    NO_REGISTRATION = "registrationTimeout"
    """Websocket only: no registration within `limits.registrationTimeout`."""
    NOT_TEXT = "registrationNotText"
    """Websocket only: the first frame is not a text frame."""
    INVALID = "invalidRegistration"
    FORBIDDEN = "registrationForbidden"
    """A resource outside the identity's `listen:` scopes."""
    TOO_MANY_REGISTRATIONS = "tooManyRegistrations"
    TOO_MANY_LISTENERS = "tooManyListeners"
    TAIL_NOT_READING = "tailNotReading"
    INVALID_CURSOR = "invalidCursor"
    OVERLOADED = "overloaded"
    EPOCH_NOT_READ = "epochNotRead"
    BUCKET_UNAVAILABLE = "bucketUnavailable"
    # The pull routes' own (their close codes are never sent: no websocket asks them).
    UNKNOWN_CONSUMER = "unknownConsumer"
    """A durable or feed consumer that config.js does not list."""
    CURSOR_GONE = "cursorGone"
    """A cursor older than the retained log, or of another bucket epoch."""
    TOO_MANY_CURSOR_SETS = "tooManyCursorSets"
    CONSUMER_EXISTS = "consumerExists"
    NO_SUCH_CONSUMER = "consumerNotFound"
    OUTCOME_UNKNOWN = "outcomeUnknown"
    """A durable settlement sent to Redis without an answer."""


@dataclass(frozen=True, slots=True)
class Rule:
    """How one kind of refusal is told to the client, by transport."""

    close_code: CloseCode
    http_status: int
    code: str
    """The `code` of the JSON error body."""
    retry_after: int | None = None
    """Seconds for the `Retry-After` header (HTTP), None for none."""
    reason: str | None = None
    """The reason text, when it is always the same (else the refusal's own)."""


def _bucket(close_code: CloseCode, error: type[BucketUnavailable]) -> Rule:
    """The rule of a bucket error: its close code, and its HTTP answer as every route gives it
    (`publisher.web.http.BUCKET_ANSWERS`)."""
    answer = BUCKET_ANSWERS[error]
    return Rule(close_code, answer.status, answer.code, answer.retry_after, answer.message)


C = CloseCode
RULES: Mapping[Why, Rule] = {
    Why.NO_REGISTRATION: Rule(C.POLICY_VIOLATION, 408, "RegistrationTimeout"),
    Why.NOT_TEXT: Rule(C.UNSUPPORTED_DATA, 400, "InvalidRegistration",
                       reason="registration must be a text frame"),
    Why.INVALID: Rule(C.POLICY_VIOLATION, 400, "InvalidRegistration"),
    Why.FORBIDDEN: Rule(C.POLICY_VIOLATION, 403, "Forbidden"),
    Why.TOO_MANY_REGISTRATIONS: Rule(C.TRY_AGAIN_LATER, 503, "TryAgainLater", 1),
    Why.TOO_MANY_LISTENERS: Rule(C.TRY_AGAIN_LATER, 503, "TryAgainLater", 1),
    Why.TAIL_NOT_READING: _bucket(C.TRY_AGAIN_LATER, BucketUnavailable),
    Why.INVALID_CURSOR: Rule(C.POLICY_VIOLATION, 400, "InvalidCursor"),
    Why.OVERLOADED: _bucket(C.OVERLOADED, BucketBusy),
    Why.EPOCH_NOT_READ: _bucket(C.TRY_AGAIN_LATER, EpochNotRead),
    Why.BUCKET_UNAVAILABLE: _bucket(C.TRY_AGAIN_LATER, BucketUnavailable),
    Why.UNKNOWN_CONSUMER: Rule(C.POLICY_VIOLATION, 403, "UnknownConsumer"),
    Why.CURSOR_GONE: Rule(C.POLICY_VIOLATION, 410, "CursorGone"),
    Why.TOO_MANY_CURSOR_SETS: Rule(C.TRY_AGAIN_LATER, 409, "TooManyCursorSets"),
    Why.CONSUMER_EXISTS: Rule(C.POLICY_VIOLATION, 409, "ConsumerExists"),
    Why.NO_SUCH_CONSUMER: Rule(C.POLICY_VIOLATION, 404, "ConsumerNotFound"),
    Why.OUTCOME_UNKNOWN: Rule(C.TRY_AGAIN_LATER, 503, "OutcomeUnknown",
                              http.RETRY_UNAVAILABLE),
}
"""Every refusal of a registration: its close code, HTTP status, JSON code and retry delay."""
del C

BY_ACCESS = frozenset({Why.FORBIDDEN, Why.TOO_MANY_REGISTRATIONS, Why.TOO_MANY_LISTENERS})
"""The refusals of the access checks (`Access.registration_refusal`), which log them."""

EXCEPTIONS: Mapping[type[ChangefeedError], Why] = {
    RegistrationError: Why.INVALID,
    CursorError: Why.INVALID_CURSOR,
    BucketBusy: Why.OVERLOADED,
    EpochNotRead: Why.EPOCH_NOT_READ,
    BucketUnavailable: Why.BUCKET_UNAVAILABLE,
    CommitOutcomeUnknown: Why.OUTCOME_UNKNOWN,
    CursorGone: Why.CURSOR_GONE,
    CursorSetsFull: Why.TOO_MANY_CURSOR_SETS,
    ConsumerExists: Why.CONSUMER_EXISTS,
    NoSuchConsumer: Why.NO_SUCH_CONSUMER,
}
"""The exceptions of a registration (parsing it, finding its start) or a pull request, and what
each refuses."""
START_ERRORS: tuple[type[ChangefeedError], ...] = (
    RegistrationError, CursorError, BucketUnavailable,
)
"""What a handler catches around the hub's `start_of`, to pass to `started`."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A registration refused: the close code for a websocket, the status and body for HTTP."""

    why: Why
    reason: str

    @property
    def rule(self) -> Rule:
        return RULES[self.why]

    @property
    def close_code(self) -> CloseCode:
        return self.rule.close_code

    @property
    def http_status(self) -> int:
        return self.rule.http_status

    @property
    def code(self) -> str:
        return self.rule.code

    def headers(self) -> dict[str, str] | None:
        """The HTTP headers of the refusal (`Retry-After`), None for none."""
        seconds = self.rule.retry_after
        return None if seconds is None else {"Retry-After": str(seconds)}


@dataclass(frozen=True, slots=True)
class Admitted:
    """A registration admitted: its stream starts after `start`; `resumed` says whether that is
    where its `since` asked."""

    registration: Registration
    start: Vector
    resumed: bool


def refused(why: Why, reason: str | None = None) -> Refused:
    """The refusal `why`, with its rule's fixed reason unless `reason` is given."""
    text = reason if reason is not None else RULES[why].reason
    return Refused(why, text if text is not None else why.value)


def refusal_of(exc: ChangefeedError) -> Refused:
    """The refusal an exception of `EXCEPTIONS` stands for (KeyError for any other)."""
    why = next(EXCEPTIONS[kind] for kind in type(exc).__mro__ if kind in EXCEPTIONS)
    if isinstance(exc, RegistrationError):
        return refused(why, exc.reason)
    if isinstance(exc, CursorError):
        return refused(why, f"since: {exc}")
    return refused(why, None if RULES[why].reason is not None else str(exc))


AccessCheck = Callable[[Registration], Refused | None]
"""The access checks of the registration's identity and client (`Access.registration_refusal`
bound to them): a refusal, or None."""


def check(
    frame: str | bytes, version: int, resources: Mapping[str, Resource], access: AccessCheck,
    tail_healthy: bool,
) -> Registration | Refused:
    """Step 1: the registration `frame` parsed and checked, in this order: its form
    (`parse_registration`), the access checks, the tail's health."""
    try:
        registration = parse_registration(frame, version, resources)
    except RegistrationError as exc:
        return refusal_of(exc)
    refusal = access(registration)
    if refusal is not None:
        return refusal
    if not tail_healthy:
        return refused(Why.TAIL_NOT_READING)
    return registration


def started(
    registration: Registration, outcome: tuple[Vector, bool] | ChangefeedError
) -> Admitted | Refused:
    """Step 2: the hub's answer to where `registration` starts (`Hub.start_of`), or the
    exception it raised (one of `START_ERRORS`)."""
    if isinstance(outcome, ChangefeedError):
        return refusal_of(outcome)
    start, resumed = outcome
    return Admitted(registration, start, resumed)


__all__ = [
    "BY_ACCESS", "EXCEPTIONS", "RULES", "START_ERRORS", "AccessCheck", "Admitted", "Refused",
    "Rule", "Why", "check", "refusal_of", "refused", "started",
]
