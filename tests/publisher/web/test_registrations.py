"""The admission core of registrations, driven synchronously: every refusal, on its close code
and its HTTP status, with no event loop, no sockets and no Redis."""

from __future__ import annotations

import orjson
import pytest

from changefeed.errors import (
    BucketBusy,
    BucketUnavailable,
    CursorError,
    EpochNotRead,
    RegistrationError,
)
from changefeed.protocol import CloseCode, Registration, Resource
from publisher.bucket import Vector
from publisher.web.registrations import (
    BY_ACCESS,
    EXCEPTIONS,
    RULES,
    START_ERRORS,
    Admitted,
    Refused,
    Why,
    check,
    refusal_of,
    refused,
    started,
)

RESOURCES = {"vm": Resource("vm", ("nic", "alias"), "/vms")}
FRAME = orjson.dumps({"instance": "i-1", "service": "tcns",
                      "changeKind": {"resource": "vm", "subResources": ["nic"]}})
START = Vector.zero("e1", 1, False)


def allow(registration: Registration) -> Refused | None:
    return None


def test_a_good_registration_from_an_allowed_client_is_admitted_where_it_starts() -> None:
    registration = check(FRAME, 1, RESOURCES, allow, tail_healthy=True)
    assert isinstance(registration, Registration) and registration.instance == "i-1"
    admitted = started(registration, (START, True))
    assert admitted == Admitted(registration, START, True)


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"{not json", "registration is not valid JSON"),
        (b"[]", "registration must be a JSON object"),
        (orjson.dumps({"instance": "i-1", "changeKind": {"resource": "disk",
                                                         "subResources": ["x"]}}),
         "unknown resource 'disk'"),
    ],
)
def test_an_invalid_registration_is_1008_or_400(frame: bytes, reason: str) -> None:
    refusal = check(frame, 1, RESOURCES, allow, tail_healthy=True)
    assert isinstance(refusal, Refused) and refusal.why is Why.INVALID
    assert (refusal.close_code, refusal.http_status, refusal.code) == (
        CloseCode.POLICY_VIOLATION, 400, "InvalidRegistration")
    assert reason in refusal.reason and refusal.headers() is None


@pytest.mark.parametrize(
    ("why", "close_code", "status", "code"),
    [
        (Why.FORBIDDEN, CloseCode.POLICY_VIOLATION, 403, "Forbidden"),
        (Why.TOO_MANY_REGISTRATIONS, CloseCode.TRY_AGAIN_LATER, 503, "TryAgainLater"),
        (Why.TOO_MANY_LISTENERS, CloseCode.TRY_AGAIN_LATER, 503, "TryAgainLater"),
    ],
)
def test_the_access_checks_refusal_is_passed_on_as_they_said(
    why: Why, close_code: CloseCode, status: int, code: str
) -> None:
    said = refused(why, "the access checks' reason")
    refusal = check(FRAME, 1, RESOURCES, lambda registration: said, tail_healthy=False)
    assert refusal is said  # before the tail's health: the access checks come first
    assert (refusal.close_code, refusal.http_status, refusal.code) == (close_code, status, code)
    assert why in BY_ACCESS


def test_the_access_checks_never_see_an_invalid_registration() -> None:
    seen: list[Registration] = []

    def access(registration: Registration) -> Refused | None:
        seen.append(registration)
        return None

    assert isinstance(check(b"{}", 1, RESOURCES, access, tail_healthy=True), Refused)
    assert seen == []


def test_a_tail_not_reading_is_1013_or_503_with_retry_after() -> None:
    refusal = check(FRAME, 1, RESOURCES, allow, tail_healthy=False)
    assert isinstance(refusal, Refused) and refusal.why is Why.TAIL_NOT_READING
    assert (refusal.close_code, refusal.http_status, refusal.code) == (
        CloseCode.TRY_AGAIN_LATER, 503, "BucketUnavailable")
    assert refusal.headers() == {"Retry-After": "5"}
    assert refusal.reason == "change bucket unavailable, try again later"


@pytest.mark.parametrize(
    ("error", "close_code", "status", "code", "retry", "reason"),
    [
        (CursorError("x", "not a cursor"), CloseCode.POLICY_VIOLATION, 400, "InvalidCursor",
         None, "since: invalid cursor 'x': not a cursor"),
        (BucketBusy("pool"), CloseCode.OVERLOADED, 503, "Overloaded", "1",
         "publisher overloaded"),
        (EpochNotRead("e2"), CloseCode.TRY_AGAIN_LATER, 503, "EpochNotRead", "1",
         "new epoch"),
        (BucketUnavailable("down"), CloseCode.TRY_AGAIN_LATER, 503, "BucketUnavailable", "5",
         "change bucket unavailable"),
    ],
)
def test_where_it_starts_failing_is_refused_by_the_table(
    error: Exception, close_code: CloseCode, status: int, code: str, retry: str | None,
    reason: str,
) -> None:
    registration = check(FRAME, 1, RESOURCES, allow, tail_healthy=True)
    assert isinstance(registration, Registration)
    assert isinstance(error, START_ERRORS)
    refusal = started(registration, error)
    assert isinstance(refusal, Refused)
    assert (refusal.close_code, refusal.http_status, refusal.code) == (close_code, status, code)
    assert refusal.headers() == (None if retry is None else {"Retry-After": retry})
    assert reason in refusal.reason


def test_the_websocket_only_refusals() -> None:
    timeout = refused(Why.NO_REGISTRATION, "no registration within 5 s")
    assert (timeout.close_code, timeout.reason) == (CloseCode.POLICY_VIOLATION,
                                                    "no registration within 5 s")
    binary = refused(Why.NOT_TEXT)
    assert (binary.close_code, binary.reason) == (CloseCode.UNSUPPORTED_DATA,
                                                  "registration must be a text frame")


def test_every_refusal_has_a_rule_and_every_exception_a_refusal() -> None:
    assert set(RULES) == set(Why)
    assert refusal_of(RegistrationError(CloseCode.POLICY_VIOLATION, "bad")).reason == "bad"
    # A subclass is refused as its nearest class in the table (EpochNotRead is a
    # BucketUnavailable, refused on its own row).
    assert {refusal_of(kind("x")).why for kind in (EpochNotRead, BucketBusy)} == {
        Why.EPOCH_NOT_READ, Why.OVERLOADED}
    assert set(EXCEPTIONS.values()) <= set(Why)
    for rule in RULES.values():
        assert rule.http_status in (400, 403, 404, 408, 409, 410, 503)
        assert (rule.http_status == 503) == (rule.retry_after is not None)
