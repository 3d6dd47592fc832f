"""The listener's state machine, driven synchronously: no event loop, no sockets, no clock."""

from __future__ import annotations

import random

import orjson
import pytest

from changefeed.backoff import Backoff
from changefeed.errors import (
    BootstrapFailed,
    BufferOverflow,
    ConfigError,
    ConnectionLost,
    ProtocolError,
    RegistrationRejected,
    RetriesExhausted,
)
from changefeed.protocol import ChangeItem
from changefeed.watch import Watch
from listener.events import BootstrapDone, ChangeEvent, Resync
from listener.state import ListenerCore, Phase, publisher_urls

URL = "http://pub1:8080"


def core(**kwargs: object) -> ListenerCore:
    options: dict[str, object] = {
        "instance": "i-1",
        "service": "tcns",
        "resources": {"vm": ["nic", "alias"]},
        "backoff": Backoff(initial=1, maximum=8, factor=2, jitter=0),
        "rng": random.Random(0),
    }
    options.update(kwargs)
    urls = options.pop("urls", URL)
    return ListenerCore(urls, **options)  # type: ignore[arg-type]


def v1_reply(cursor: str | None = "e.1", resumed: bool = False) -> bytes:
    return orjson.dumps({"resource": "vm", "subResources": ["nic", "alias", "state"],
                         "bootstrapRoute": "/vms", "cursor": cursor, "resumed": resumed})


def item(id: str, cursor: str, subs: tuple[str, ...] = ("nic",)) -> bytes:
    return ChangeItem("vm", subs, id, 1, cursor).encode()


def bootstrapped(listener: ListenerCore, cursor: str = "e.1") -> None:
    listener.attempt()
    listener.reply(v1_reply(cursor), now=0)
    listener.bootstrap_done("vm", now=0)


def test_publisher_urls_accept_http_ws_and_the_changefeeds_path() -> None:
    assert publisher_urls("http://h:1") == ("http://h:1", "ws://h:1/changefeeds")
    assert publisher_urls("ws://h:1/changefeeds") == ("http://h:1", "ws://h:1/changefeeds")
    assert publisher_urls("https://h/api/") == ("https://h/api", "wss://h/api/changefeeds")
    with pytest.raises(ValueError, match="expected http"):
        publisher_urls("redis://h:1")


def test_one_resource_registers_v1_and_several_v2() -> None:
    attempt = core().attempt()
    assert attempt.headers == {"Accept-Version": "~1"}
    assert attempt.ws_url == "ws://pub1:8080/changefeeds"
    assert orjson.loads(attempt.frame) == {
        "instance": "i-1", "service": "tcns",
        "changeKind": {"resource": "vm", "subResources": ["nic", "alias"]},
    }
    attempt = core(resources={"vm": ["nic"], "network": ["*"]}).attempt()
    assert attempt.headers == {"Accept-Version": "~2"}
    assert orjson.loads(attempt.frame)["resources"] == [
        {"resource": "vm", "subResources": ["nic"]},
        {"resource": "network", "subResources": ["*"]},
    ]


def test_first_registration_bootstraps_without_resync_then_streams() -> None:
    listener = core()
    listener.attempt()
    plan = listener.reply(v1_reply("e.5"), now=0)
    assert (plan.resumed, plan.resync, [r.resource for r in plan.routes]) == (False, None, ["vm"])
    assert listener.phase is Phase.BOOTSTRAPPING
    assert listener.route_url("vm") == "http://pub1:8080/vms"
    assert listener.bootstrap_done("vm", now=0) == BootstrapDone("vm", "e.5")
    assert listener.phase is Phase.STREAMING  # type: ignore[comparison-overlap]
    assert listener.cursor == "e.5"


def test_the_cursor_is_only_set_by_the_last_bootstrap_done() -> None:
    listener = core(resources={"vm": ["nic"], "network": ["ips"]})
    listener.attempt()
    reply = {"bootstrapRoutes": [
        {"resource": "vm", "subResources": ["nic"], "bootstrapRoute": "/vms"},
        {"resource": "network", "subResources": ["ips"], "bootstrapRoute": "/networks"},
    ], "cursor": "e.9", "resumed": False}
    plan = listener.reply(orjson.dumps(reply), now=0)
    assert [r.resource for r in plan.routes] == ["vm", "network"]
    assert listener.bootstrap_done("vm", now=0) == BootstrapDone("vm", None)
    assert listener.cursor is None
    assert listener.bootstrap_done("network", now=0) == BootstrapDone("network", "e.9")


def test_delivered_items_move_the_cursor_and_reconnect_resumes_after_it() -> None:
    listener = core()
    bootstrapped(listener)
    change = listener.item(item("a", "e.2"))
    assert change is not None
    assert listener.delivered(change) == ChangeEvent(change)
    assert listener.cursor == "e.2"
    listener.failed(ConnectionLost(URL, "reset", 1006), now=1)
    attempt = listener.attempt()
    assert attempt.registration.since == "e.2"
    plan = listener.reply(v1_reply("e.7", resumed=True), now=2)
    assert plan.resumed and plan.routes == () and plan.resync is None
    assert listener.phase is Phase.STREAMING
    assert listener.cursor == "e.2"


def test_not_resumed_after_a_view_means_exactly_one_resync() -> None:
    listener = core()
    bootstrapped(listener)
    listener.failed(ConnectionLost(URL, "reset", 1006), now=1)
    listener.attempt()
    plan = listener.reply(v1_reply("e.8", resumed=False), now=2)
    assert plan.resync == Resync("the publisher cannot resume after cursor e.1")
    assert listener.cursor is None
    # The bootstrap fails half way: the next attempt bootstraps again, without another resync.
    listener.failed(BootstrapFailed(URL + "/vms", "HTTP 500", 500), now=3)
    attempt = listener.attempt()
    assert attempt.registration.since is None
    plan = listener.reply(v1_reply("e.9"), now=4)
    assert plan.resync is None and [r.resource for r in plan.routes] == ["vm"]


def test_a_stored_cursor_resumes_or_resyncs() -> None:
    listener = core(since="e.3")
    assert listener.attempt().registration.since == "e.3"
    plan = listener.reply(v1_reply("e.4", resumed=False), now=0)
    assert plan.resync is not None
    assert core(since="e.3").cursor == "e.3"


def test_resumed_is_ignored_without_since() -> None:
    listener = core()
    listener.attempt()
    assert not listener.reply(v1_reply(resumed=True), now=0).resumed


def test_frames_are_validated() -> None:
    listener = core()
    bootstrapped(listener)
    assert listener.item(b"heartbeat") is None
    assert listener.item(item("a", "e.2", ("alias",))) is not None
    for bad in (b"not json", b"[1]", b'{"changeKind": 3}', v1_reply(),
                item("a", "e.2", ("state",)),
                ChangeItem("network", ("ips",), "n", 1, "e.3").encode()):
        with pytest.raises(ProtocolError):
            listener.item(bad)


def test_a_reply_must_be_a_reply_for_every_resource() -> None:
    for bad in (item("a", "e.1"), b"garbage",
                orjson.dumps({"bootstrapRoutes": [], "cursor": "e.1"})):
        listener = core()
        listener.attempt()
        with pytest.raises(ProtocolError):
            listener.reply(bad, now=0)


def test_buffer_overflow_aborts_past_the_size() -> None:
    listener = core(buffer_size=3)
    listener.check_buffer(3)
    with pytest.raises(BufferOverflow) as caught:
        listener.check_buffer(4)
    assert caught.value.size == 3


def test_failures_back_off_and_rotate_urls() -> None:
    listener = core(urls=["http://a:1", "http://b:2"])
    delays, urls = [], []
    for _ in range(5):
        urls.append(listener.attempt().url)
        delays.append(listener.failed(ConnectionLost(listener.url, "refused"), now=0))
        assert listener.phase is Phase.BACKING_OFF
    assert urls == ["http://a:1", "http://b:2"] * 2 + ["http://a:1"]
    assert delays == [1, 2, 4, 8, 8]


def test_backoff_starts_again_after_a_healthy_period() -> None:
    listener = core(healthy_after=30)
    for _ in range(3):
        listener.attempt()
        listener.failed(ConnectionLost(URL, "refused"), now=0)
    bootstrapped(listener)  # healthy from now=0
    assert listener.failed(ConnectionLost(URL, "reset", 1006), now=10) == 8  # not long enough
    bootstrapped(listener)
    assert listener.failed(ConnectionLost(URL, "reset", 1006), now=40) == 1
    assert listener.failures == 1


def test_a_rejected_registration_is_raised_not_retried() -> None:
    listener = core()
    listener.attempt()
    with pytest.raises(RegistrationRejected) as caught:
        listener.failed(ConnectionLost(URL, "closed", 1008, "unknown resource 'vm'"), now=0)
    assert (caught.value.close_code, caught.value.reason) == (1008, "unknown resource 'vm'")
    assert listener.phase is Phase.CLOSED


def test_a_refused_cursor_is_dropped_and_the_view_resynced() -> None:
    listener = core(since="garbage")
    listener.attempt()
    reason = "since: invalid cursor 'garbage': not a cursor issued by this change feed"
    assert listener.failed(ConnectionLost(URL, "closed", 1008, reason), now=0) == 1
    assert listener.attempt().registration.since is None
    assert listener.reply(v1_reply(), now=1).resync is not None


def test_a_late_registration_is_retried() -> None:
    listener = core()
    listener.attempt()
    assert listener.failed(ConnectionLost(URL, "closed", 1008, "no registration within 10 s"),
                           now=0) == 1


def test_policy_close_after_registration_is_retried() -> None:
    listener = core()
    bootstrapped(listener)
    assert listener.failed(ConnectionLost(URL, "closed", 1008, "?"), now=0) == 1


@pytest.mark.parametrize("code", [1000, 1001, 1006, 1011, 1013, 4008, 4009])
def test_other_close_codes_are_retried(code: int) -> None:
    listener = core()
    listener.attempt()
    assert listener.failed(ConnectionLost(URL, "closed", code), now=0) == 1


def test_retries_are_bounded() -> None:
    listener = core(backoff=Backoff(initial=1, maximum=1, retries=2))
    for _ in range(2):
        listener.attempt()
        listener.failed(ProtocolError("garbage"), now=0)
    listener.attempt()
    with pytest.raises(RetriesExhausted) as caught:
        listener.failed(ProtocolError("garbage"), now=0)
    assert caught.value.attempts == 3
    assert isinstance(caught.value.last, ProtocolError)


def test_errors_that_are_not_retryable_are_raised() -> None:
    error = ConfigError("k", 1, "a string")
    listener = core()
    listener.attempt()
    with pytest.raises(ConfigError):
        listener.failed(error, now=0)
    assert listener.phase is Phase.CLOSED


def test_out_of_order_calls_are_refused() -> None:
    listener = core()
    with pytest.raises(RuntimeError):
        listener.reply(v1_reply(), now=0)
    listener.attempt()
    with pytest.raises(RuntimeError):
        listener.attempt()


def test_invalid_arguments() -> None:
    cases: list[dict[str, object]] = [
        {"urls": []}, {"instance": ""}, {"resources": {}},
        {"resources": {"vm": "nic"}}, {"resources": {"vm": []}},
    ]
    for kwargs in cases:
        with pytest.raises(ValueError):
            core(**kwargs)


def test_without_bootstrap_changes_stream_at_once_and_gaps_resync() -> None:
    listener = core(bootstrap=False)
    listener.attempt()
    plan = listener.reply(v1_reply("e.4"), now=0)
    assert (plan.routes, plan.resync, listener.phase) == ((), None, Phase.STREAMING)
    assert listener.cursor == "e.4"
    listener.failed(ConnectionLost(URL, "reset", 1006), now=1)
    assert listener.attempt().registration.since == "e.4"
    assert listener.reply(v1_reply("e.9"), now=2).resync is not None


def test_a_watch_goes_into_the_registration_and_the_bootstrap_url() -> None:
    watches = {"vm": Watch.of(ids=["x", "a b"], prefixes=["servers/"])}
    listener = core(resources={"vm": ["nic"], "network": ["*"]}, watches=watches)
    attempt = listener.attempt()
    assert orjson.loads(attempt.frame)["resources"] == [
        {"resource": "vm", "subResources": ["nic"], "ids": ["a b", "x"], "prefixes": ["servers"]},
        {"resource": "network", "subResources": ["*"]},
    ]
    listener.reply(orjson.dumps({"bootstrapRoutes": [
        {"resource": "vm", "subResources": ["nic"], "bootstrapRoute": "/vms"},
        {"resource": "network", "subResources": ["ips"], "bootstrapRoute": "/api/networks"},
    ], "cursor": "e.1", "resumed": False}), now=0)
    assert listener.bootstrap_url("vm") == "http://pub1:8080/vms?id=a+b&id=x&prefix=servers"
    assert listener.bootstrap_url("network") == "http://pub1:8080/api/networks"
    assert listener.route_url("vm") == "http://pub1:8080/vms"  # fetch: no watch parameters


def test_items_outside_the_watch_are_dropped_and_others_still_refused() -> None:
    """A publisher that ignores watches (Triton's) sends every item: the listener filters."""
    listener = core(watches={"vm": Watch.of(prefixes=["servers"])})
    bootstrapped(listener)
    assert listener.item(item("servers/1", "e.2")) is not None
    assert listener.item(item("servers", "e.3")) is not None
    assert listener.item(item("serversX", "e.4")) is None
    with pytest.raises(ProtocolError):
        listener.item(item("servers/1", "e.5", ("state",)))


@pytest.mark.parametrize(
    ("watches", "message"),
    [
        ({"disk": Watch.of(ids=["a"])}, "watches name resources not in resources: disk"),
        ({"vm": Watch.of(ids=[""])}, "watches['vm'].ids must hold non-empty strings"),
        # Watch.of drops trailing slashes: "/" is the empty prefix.
        ({"vm": Watch.of(prefixes=["/"])}, "watches['vm'].prefixes must hold non-empty strings"),
        ({"vm": {"ids": ["a"]}}, "watches['vm']: expected a Watch"),
    ],
)
def test_bad_watches_are_refused_before_connecting(watches: object, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        core(watches=watches)
    assert str(raised.value).startswith(message)


def test_coalesce_is_asked_for_only_when_chosen_and_granted_only_when_echoed() -> None:
    assert "coalesce" not in orjson.loads(core().attempt().frame)
    listener = core(coalesce=True)
    assert orjson.loads(listener.attempt().frame)["coalesce"] is True
    granted = {**orjson.loads(v1_reply()), "coalesce": True}
    assert listener.reply(orjson.dumps(granted), now=0).coalesce is True
    other = core(coalesce=True)
    other.attempt()
    assert other.reply(v1_reply(), now=0).coalesce is False, "an older publisher: not echoed"
    plain = core()
    plain.attempt()
    assert plain.reply(orjson.dumps(granted), now=0).coalesce is False


def test_coalesced_items_move_the_cursor_only_at_the_end_of_their_catch_up() -> None:
    listener = core(coalesce=True)
    bootstrapped(listener)
    listener.delivered(listener.item(item("a", "e.2")))  # type: ignore[arg-type]
    assert listener.cursor == "e.2"
    for id_, cursor, last in (("b", "e.5", False), ("a", "e.7", False), ("c", "e.9", True)):
        frame = ChangeItem("vm", ("nic", "alias"), id_, 1, cursor, coalesced=True,
                           caught_up=last).encode()
        received = listener.item(frame)
        assert received is not None and received.coalesced
        change = listener.delivered(received)
        assert change.coalesced and change.caught_up is last
        # Until the catch-up ends, a resume must start where the exact items stopped: an id
        # still to come may have changed before this cursor.
        assert listener.cursor == (cursor if last else "e.2")
    listener.delivered(listener.item(item("a", "e.10")))  # type: ignore[arg-type]
    assert listener.cursor == "e.10"
