"""Checks of discovery and registration: GET /changefeeds, the v1 and v2 replies, the
Accept-Version negotiation, heartbeats, and every documented refusal of a bad registration
(docs/protocol.md, "Registration" and "Close codes")."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from changefeed.protocol import is_registration_reply
from changefeed_testing.conformance.outcome import Failed
from changefeed_testing.conformance.probe import (
    Closed,
    Silence,
    close_after,
    receive,
    reply_to,
    socket,
)
from changefeed_testing.conformance.target import Target, check, expect

# --- shapes -------------------------------------------------------------------------------------


def entry_problems(entry: Any, where: str) -> list[str]:
    """What is wrong with a resource entry {resource, subResources, bootstrapRoute}."""
    if not isinstance(entry, dict):
        return [f"{where} is not an object: {entry!r:.80}"]
    problems = []
    if not isinstance(entry.get("resource"), str):
        problems.append(f"{where}.resource is not a string")
    subs = entry.get("subResources")
    if not isinstance(subs, list) or not all(isinstance(s, str) for s in subs):
        problems.append(f"{where}.subResources is not a list of strings")
    if not isinstance(entry.get("bootstrapRoute"), str) or not entry["bootstrapRoute"]:
        problems.append(f"{where}.bootstrapRoute is not a non-empty string")
    return problems


def extension_problems(reply: Mapping[str, Any], resumed: bool | None) -> list[str]:
    """What is wrong with the reply's optional `cursor` and `resumed` (absent is fine)."""
    problems = []
    if "cursor" in reply and not isinstance(reply["cursor"], str):
        problems.append(f"cursor is not a string: {reply['cursor']!r:.60}")
    if "resumed" in reply:
        if not isinstance(reply["resumed"], bool):
            problems.append(f"resumed is not a boolean: {reply['resumed']!r:.60}")
        elif resumed is not None and reply["resumed"] is not resumed:
            problems.append(f"resumed is {reply['resumed']}, expected {resumed}")
    return problems


def v1_reply_problems(reply: Mapping[str, Any], resource: str) -> list[str]:
    problems = entry_problems(dict(reply), "reply")
    if reply.get("resource") != resource:
        problems.append(f"reply.resource is {reply.get('resource')!r}, expected {resource!r}")
    if "changeKind" in reply:
        problems.append("the reply carries changeKind (listeners would take it for an item)")
    return problems + extension_problems(reply, resumed=False)


def shape(reply: Mapping[str, Any]) -> str:
    return "{" + ", ".join(reply) + "}"


def fail_on(problems: list[str]) -> None:
    if problems:
        raise Failed("; ".join(problems))


# --- discovery ----------------------------------------------------------------------------------


def parse_resources(body: Any) -> dict[str, list[str]]:
    """GET /changefeeds as `{resource: subResources}`: a list of entries, or an object with a
    `resources` list (this publisher's, with `partitions`)."""
    entries = body.get("resources") if isinstance(body, dict) else body
    if not isinstance(entries, list):
        raise Failed(f"GET /changefeeds is not a list of resources: {body!r:.120}")
    problems = [p for i, e in enumerate(entries) for p in entry_problems(e, f"resources[{i}]")]
    fail_on(problems)
    return {e["resource"]: list(e["subResources"]) for e in entries}


@check("resources", "discovery", "GET /changefeeds lists the resources with their sub-resources "
       "and bootstrap routes, the checked one among them")
async def resources(target: Target) -> str:
    timeout = aiohttp.ClientTimeout(total=target.timeout)
    try:
        async with (aiohttp.ClientSession(timeout=timeout) as session,
                    session.get(target.url + "/changefeeds") as response):
            raw = await response.read()
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise Failed(f"GET /changefeeds failed: {exc!r}") from None
    expect(status == 200, f"GET /changefeeds answered HTTP {status}")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise Failed(f"GET /changefeeds is not JSON: {raw[:120]!r}") from None
    resources = parse_resources(body)
    target.learn_resources(resources)
    expect(target.resource in resources,
           f"{target.resource!r} is not among the resources {sorted(resources)}")
    return f"{len(resources)} resource(s): " + ", ".join(
        f"{r} ({','.join(s)})" for r, s in resources.items())


# --- registration -------------------------------------------------------------------------------


async def v1_reply(target: Target, version: str | None) -> dict[str, Any]:
    async with socket(target.ws_url, version, target.timeout) as ws:
        return await reply_to(ws, target.v1(), target.timeout)


@check("registration-v1", "registration", "Accept-Version ~1 and a changeKind: the reply is the "
       "resource's entry (resource, subResources, bootstrapRoute; cursor, resumed: false)")
async def registration_v1(target: Target) -> str:
    reply = await v1_reply(target, "~1")
    fail_on(v1_reply_problems(reply, target.resource))
    return f"reply {shape(reply)}"


@check("registration-v1-no-version", "registration", "no Accept-Version header means v1 "
       "(node-sdc-changefeed listeners before 1.5)")
async def registration_v1_no_version(target: Target) -> str:
    reply = await v1_reply(target, None)
    fail_on(v1_reply_problems(reply, target.resource))
    return f"reply {shape(reply)}"


@check("registration-v2", "registration", "Accept-Version ~2 and resources: the reply is "
       "{bootstrapRoutes: [an entry per resource, in registration order], cursor, resumed}")
async def registration_v2(target: Target) -> str:
    kinds = {target.resource: target.subs()}
    other = target.other_resource()
    if other is not None and target.resources is not None:
        kinds[other] = target.resources[other]
    async with socket(target.ws_url, "~2", target.timeout) as ws:
        reply = await reply_to(ws, target.v2(kinds), target.timeout)
    routes = reply.get("bootstrapRoutes")
    expect(isinstance(routes, list), f"the reply has no bootstrapRoutes list: {shape(reply)}")
    assert isinstance(routes, list)
    problems = [p for i, e in enumerate(routes) for p in entry_problems(e, f"bootstrapRoutes[{i}]")]
    fail_on(problems + extension_problems(reply, resumed=False))
    order = [entry["resource"] for entry in routes]
    expect(order == list(kinds), f"bootstrapRoutes name {order}, expected {list(kinds)}")
    return f"reply {shape(reply)} for {', '.join(kinds)}"


@check("accept-version-refused", "registration", "an Accept-Version other than 1 or 2 is "
       "refused with HTTP 400 before the upgrade")
async def accept_version_refused(target: Target) -> str:
    from websockets.asyncio.client import connect

    try:
        ws = await connect(target.ws_url, additional_headers={"Accept-Version": "~9"},
                           open_timeout=target.timeout, proxy=None, compression=None)
    except InvalidStatus as exc:
        status = exc.response.status_code
        expect(status == 400, f"the upgrade was refused with HTTP {status}, expected 400")
        return "HTTP 400"
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        raise Failed(f"cannot open a websocket: {exc!r}") from None
    await ws.close()
    raise Failed("Accept-Version ~9 was upgraded, expected HTTP 400")


@check("heartbeat", "registration", "the text `heartbeat` after registering is ignored: the "
       "socket stays open")
async def heartbeat(target: Target) -> str:
    quiet = min(0.5, target.timeout)
    async with socket(target.ws_url, "~1", target.timeout) as ws:
        await reply_to(ws, target.v1(), target.timeout)
        await ws.send("heartbeat")
        deadline = time.monotonic() + quiet
        while (left := deadline - time.monotonic()) > 0:
            answer = await receive(ws, left)
            if isinstance(answer, Closed):
                raise Failed(f"after a heartbeat the publisher {answer.describe()}")
    return f"still open {quiet:g} s after a heartbeat"


@check("close-normal", "close codes", "a listener's own close frame (1000) is answered with 1000")
async def close_normal(target: Target) -> str:
    async with socket(target.ws_url, "~1", target.timeout) as ws:
        await reply_to(ws, target.v1(), target.timeout)
        await asyncio.wait_for(ws.close(1000), target.timeout)
        received = ws.protocol.close_rcvd
    expect(received is not None, "no close frame came back")
    assert received is not None
    expect(received.code == 1000, f"answered with {received.code}, expected 1000")
    return "1000"


# --- refusals -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refusal:
    """A bad first frame and the close the publisher must answer it with."""

    name: str
    what: str
    frame: Callable[[Target], Any]
    """The frame, for a target: a registration valid but for the one fault."""
    code: int
    version: str | None = "~1"
    reason: bool = True
    """Whether the close must carry a reason (aiohttp sends 1009 without one)."""
    mentions: str = ""
    """Text the reason must contain (e.g. the unknown resource's name)."""


UNKNOWN = "conformance-unknown"


def _base(target: Target) -> dict[str, Any]:
    return {"instance": target.instance, "service": "conformance"}


def _kind(target: Target, **fields: Any) -> dict[str, Any]:
    """A valid change kind of the target's resource (its first sub-resource), with `fields`."""
    subs = (target.resources or {}).get(target.resource) or ["*"]
    return {"resource": target.resource, "subResources": subs[:1], **fields}


REFUSALS = [
    Refusal("bad-not-json", "a first frame that is not JSON: 1008", lambda t: "{not json", 1008),
    Refusal("bad-not-object", "a JSON array: 1008", lambda t: "[1, 2]", 1008),
    Refusal("bad-no-instance", "no instance: 1008",
            lambda t: {"service": "conformance", "changeKind": _kind(t)}, 1008,
            mentions="instance"),
    Refusal("bad-no-changekind", "v1 without changeKind: 1008", _base, 1008,
            mentions="changeKind"),
    Refusal("bad-unknown-resource", "an unknown resource: 1008, naming it",
            lambda t: {**_base(t), "changeKind": _kind(t, resource=UNKNOWN)}, 1008,
            mentions=UNKNOWN),
    Refusal("bad-unknown-sub-resource", "an unknown sub-resource: 1008, naming it",
            lambda t: {**_base(t), "changeKind": _kind(t, subResources=[UNKNOWN])}, 1008,
            mentions=UNKNOWN),
    Refusal("bad-empty-sub-resources", "an empty subResources list: 1008",
            lambda t: {**_base(t), "changeKind": _kind(t, subResources=[])}, 1008,
            mentions="subResources"),
    Refusal("bad-v2-no-resources", "v2 without resources: 1008", _base, 1008, "~2",
            mentions="resources"),
    Refusal("bad-v2-duplicate-resource", "v2 naming a resource twice: 1008",
            lambda t: {**_base(t), "resources": [_kind(t), _kind(t)]}, 1008, "~2"),
    Refusal("bad-binary-frame", "a binary first frame: 1003",
            lambda t: orjson.dumps({**_base(t), "changeKind": _kind(t)}), 1003),
    Refusal("bad-oversized", "a 1 MiB first frame (over limits.registrationBytes): 1009",
            lambda t: "x" * (1 << 20), 1009, reason=False),
]


def judge(refusal: Refusal, answer: Any) -> str:
    """Pass (a description) when `answer` is the close `refusal` expects, else raise Failed."""
    if isinstance(answer, Silence):
        raise Failed(f"no answer within {answer.seconds:g} s, expected a close with "
                     f"{refusal.code}")
    if not isinstance(answer, Closed):
        raise Failed(f"accepted: the publisher replied {shape(answer)}, expected a close with "
                     f"{refusal.code}")
    expect(answer.code == refusal.code, f"{answer.describe()}, expected {refusal.code}")
    if refusal.reason:
        expect(bool(answer.reason), f"closed with {answer.code} but no reason")
    if refusal.mentions:
        expect(refusal.mentions in answer.reason,
               f"the reason {answer.reason!r} does not name {refusal.mentions!r}")
    return answer.describe()


def refusal_check(refusal: Refusal) -> None:
    """Register the check of one refusal."""

    async def run(target: Target) -> str:
        frame = refusal.frame(target)
        answer = await close_after(target.ws_url, frame, refusal.version, target.timeout)
        return judge(refusal, answer)

    check(refusal.name, "bad registrations", refusal.what)(run)


for _refusal in REFUSALS:
    refusal_check(_refusal)


@check("bad-second-registration", "bad registrations", "a second text frame (not heartbeat) "
       "after registering: 1008")
async def second_registration(target: Target) -> str:
    async with socket(target.ws_url, "~1", target.timeout) as ws:
        await reply_to(ws, target.v1(), target.timeout)
        try:
            await ws.send(orjson.dumps(target.v1()).decode())
        except ConnectionClosed as exc:
            raise Failed(f"the socket closed before the second registration: {exc}") from None
        answer: Any = Silence(target.timeout)
        deadline = time.monotonic() + target.timeout
        while (left := deadline - time.monotonic()) > 0:
            answer = await receive(ws, left)
            if not isinstance(answer, dict) or is_registration_reply(answer):
                break  # a close, silence, or a second reply: judged below
            answer = Silence(target.timeout)  # a change item: keep waiting for the close
    return judge(SECOND, answer)


SECOND = Refusal("bad-second-registration", "", lambda t: "", 1008)
