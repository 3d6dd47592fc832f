"""Checks of change items: their shape, their order, and that a registration receives only the
sub-resources it asked for (docs/protocol.md, "Change items" and "Matching").

The items are caused by the target's change maker, with ids unique to the run, so other traffic
on a busy publisher is ignored. Without a change maker, `item-shape` judges whatever item arrives
within `--wait` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from websockets.asyncio.client import ClientConnection

from changefeed.protocol import is_registration_reply
from changefeed_testing.conformance.outcome import Failed, NotRun
from changefeed_testing.conformance.probe import Closed, Silence, receive, reply_to, socket
from changefeed_testing.conformance.target import Target, check, expect


def item_problems(item: Mapping[str, Any]) -> list[str]:
    """What is wrong with a change item (RFD 5's fields; the extensions when present)."""
    problems = []
    if is_registration_reply(item):
        problems.append("an item carries bootstrapRoute(s), like a registration reply")
    kind = item.get("changeKind")
    if not isinstance(kind, dict):
        problems.append("changeKind is not an object")
    else:
        if not isinstance(kind.get("resource"), str):
            problems.append("changeKind.resource is not a string")
        subs = kind.get("subResources")
        if not isinstance(subs, list) or not subs or not all(isinstance(s, str) for s in subs):
            problems.append("changeKind.subResources is not a non-empty list of strings")
    if not isinstance(item.get("changedResourceId"), str) or not item["changedResourceId"]:
        problems.append("changedResourceId is not a non-empty string")
    if "published" in item:
        published = item["published"]
        if not isinstance(published, str) or not published.isdigit():
            problems.append(f"published is not a string of digits: {published!r:.40}")
        elif abs(int(published) / 1000 - time.time()) > 86400 * 365 * 10:
            problems.append(f"published {published} is not milliseconds since the epoch")
    if "cursor" in item and (not isinstance(item["cursor"], str) or not item["cursor"]):
        problems.append(f"cursor is not a non-empty string: {item['cursor']!r:.40}")
    return problems


def describe(item: Mapping[str, Any]) -> str:
    return "{" + ", ".join(item) + "}"


async def collect(
    ws: ClientConnection, target: Target, wanted: list[str], seconds: float
) -> list[dict[str, Any]]:
    """Read until every id of `wanted` has arrived; return this run's items in arrival order
    (items of other ids are checked for shape and skipped). Raises Failed on a close, a
    malformed item, or a timeout."""
    ours: list[dict[str, Any]] = []
    missing = list(wanted)
    deadline = time.monotonic() + seconds
    while missing:
        answer = await receive(ws, max(0.0, deadline - time.monotonic()))
        if isinstance(answer, Closed):
            raise Failed(f"waiting for items {missing}, the publisher {answer.describe()}")
        if isinstance(answer, Silence):
            raise Failed(f"items {missing} did not arrive within {seconds:g} s")
        problems = item_problems(answer)
        if problems:
            raise Failed(f"malformed item {describe(answer)}: " + "; ".join(problems))
        id = answer["changedResourceId"]
        if id.startswith(target.id_prefix):
            ours.append(answer)
            if id in missing:
                missing.remove(id)
    return ours


async def quiet(ws: ClientConnection, target: Target, seconds: float) -> list[dict[str, Any]]:
    """This run's items arriving within `seconds` (expected: none)."""
    ours = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        answer = await receive(ws, left)
        if isinstance(answer, Closed):
            raise Failed(f"the publisher {answer.describe()}")
        if isinstance(answer, dict) and str(answer.get("changedResourceId", "")).startswith(
            target.id_prefix
        ):
            ours.append(answer)
    return ours


def ids(items: list[dict[str, Any]]) -> list[str]:
    return [item["changedResourceId"] for item in items]


async def any_item(target: Target) -> str:
    """Without a change maker: judge the first item that arrives within `target.wait`."""
    async with socket(target.ws_url, "~1", target.timeout) as ws:
        await reply_to(ws, target.v1(), target.timeout)
        answer = await receive(ws, target.wait)
    if isinstance(answer, Silence):
        raise NotRun(f"no change arrived within {target.wait:g} s; pass --config or "
                     "--publish-command to let the check cause one")
    if isinstance(answer, Closed):
        raise Failed(f"waiting for an item, the publisher {answer.describe()}")
    problems = item_problems(answer)
    if problems:
        raise Failed(f"malformed item {describe(answer)}: " + "; ".join(problems))
    return f"{describe(answer)} (an item that arrived by itself)"


@check("item-shape", "items", "a change reaches v1 and v2 registrations as {changeKind: "
       "{resource, subResources}, changedResourceId, published, cursor}, the cursor the commit's")
async def item_shape(target: Target) -> str:
    if target.changes is None:
        return await any_item(target)
    sub = target.subs()[0]
    id = target.new_id()
    async with (socket(target.ws_url, "~1", target.timeout) as one,
                socket(target.ws_url, "~2", target.timeout) as two):
        await reply_to(one, target.v1([sub]), target.timeout)
        await reply_to(two, target.v2({target.resource: [sub]}), target.timeout)
        cursor = await target.change(id, sub)
        got = [(await collect(ws, target, [id], target.timeout))[-1] for ws in (one, two)]
    for version, item in zip(("v1", "v2"), got, strict=True):
        kind = item["changeKind"]
        expect(kind["resource"] == target.resource and sub in kind["subResources"],
               f"{version}: changeKind is {kind}, expected {target.resource} with {sub!r}")
        if cursor is not None and "cursor" in item:
            expect(item["cursor"] == cursor,
                   f"{version}: the item's cursor {item['cursor']} is not the commit's {cursor}")
    return f"{describe(got[0])} on v1 and v2"


@check("item-order", "items", "five changes arrive in commit order, each once, with cursors that "
       "increase")
async def item_order(target: Target) -> str:
    sub = target.subs()[0]
    wanted = [target.new_id() for _ in range(5)]
    async with socket(target.ws_url, "~1", target.timeout) as ws:
        await reply_to(ws, target.v1([sub]), target.timeout)
        for id in wanted:
            await target.change(id, sub)
        got = await collect(ws, target, wanted, target.timeout)
        got += await quiet(ws, target, min(0.5, target.timeout))
    expect(ids(got) == wanted, f"received {ids(got)}, expected {wanted}")
    cursors = [c for item in got if isinstance(c := item.get("cursor"), str)]
    if len(cursors) == len(got):
        expect(cursors == sorted(cursors) and len(set(cursors)) == len(cursors),
               f"cursors do not increase: {cursors}")
        return "5 items in order, cursors increasing"
    return "5 items in order (no cursors)"


@check("item-matching", "items", "a registration for one sub-resource does not receive an item "
       "of another, and does receive the next item of its own")
async def item_matching(target: Target) -> str:
    subs = target.subs()
    if len(subs) < 2:
        raise NotRun(f"{target.resource!r} has one sub-resource: nothing to filter")
    mine, other = subs[0], subs[1]
    skipped, delivered = target.new_id(), target.new_id()
    async with socket(target.ws_url, "~1", target.timeout) as ws:
        await reply_to(ws, target.v1([mine]), target.timeout)
        await target.change(skipped, other)
        await target.change(delivered, mine)
        got = await collect(ws, target, [delivered], target.timeout)
    expect(ids(got) == [delivered],
           f"a registration for {mine!r} received {ids(got)}, expected only {delivered} "
           f"(not {skipped}, a change of {other!r})")
    return f"{other!r} filtered out, {mine!r} delivered"
