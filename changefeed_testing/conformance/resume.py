"""Checks of resuming with `since` (docs/protocol.md, "Resuming"): a retained cursor resumes
with nothing lost and nothing repeated; a cursor of another epoch or beyond the log does not
resume; a `since` that is not a cursor is refused with 1008."""

from __future__ import annotations

from changefeed.cursor import Position, StreamId, new_epoch
from changefeed.errors import CursorError
from changefeed_testing.conformance.items import collect, ids, quiet
from changefeed_testing.conformance.outcome import Failed, NotRun
from changefeed_testing.conformance.probe import Closed, close_after, reply_to, socket
from changefeed_testing.conformance.registration import Refusal, judge
from changefeed_testing.conformance.target import Target, check, expect


async def reply_cursor(target: Target) -> str:
    """The cursor of a fresh registration's reply; NotRun when the publisher sends none."""
    async with socket(target.ws_url, "~1", target.timeout) as ws:
        reply = await reply_to(ws, target.v1(), target.timeout)
    cursor = reply.get("cursor")
    if not isinstance(cursor, str):
        raise NotRun("the publisher's replies carry no cursor (the since/cursor extension)")
    return cursor


async def resumed_for(target: Target, since: str) -> object:
    """The `resumed` of the reply to a registration with `since`."""
    async with socket(target.ws_url, "~1", target.timeout) as ws:
        reply = await reply_to(ws, target.v1(since=since), target.timeout)
    return reply.get("resumed")


@check("resume", "resume", "a listener that registers again with `since` = its last cursor gets "
       "resumed: true, then exactly the items it missed, then live ones: none lost or repeated")
async def resume(target: Target) -> str:
    sub = target.subs()[0]
    seen = [target.new_id() for _ in range(2)]
    missed = [target.new_id() for _ in range(3)]
    live = target.new_id()
    async with socket(target.ws_url, "~1", target.timeout) as ws:
        reply = await reply_to(ws, target.v1([sub]), target.timeout)
        if "cursor" not in reply:
            raise NotRun("the publisher's replies carry no cursor (the since/cursor extension)")
        for id in seen:
            await target.change(id, sub)
        first = await collect(ws, target, seen, target.timeout)
    since = first[-1].get("cursor")
    expect(isinstance(since, str), f"item {first[-1]} has no cursor to resume from")
    assert isinstance(since, str)
    for id in missed:
        await target.change(id, sub)
    async with socket(target.ws_url, "~1", target.timeout) as ws:
        reply = await reply_to(ws, target.v1([sub], since=since), target.timeout)
        expect(reply.get("resumed") is True,
               f"registering with since={since} got resumed: {reply.get('resumed')!r}")
        replayed = await collect(ws, target, missed, target.timeout)
        await target.change(live, sub)
        after = await collect(ws, target, [live], target.timeout)
        after += await quiet(ws, target, min(0.5, target.timeout))
    expect(ids(first) == seen, f"before closing: received {ids(first)}, expected {seen}")
    got = ids(replayed) + ids(after)
    expect(got == [*missed, live], f"after resuming: received {got}, expected {[*missed, live]}")
    return f"resumed: true, {len(missed)} missed items then the live one, nothing repeated"


@check("resume-foreign-since", "resume", "`since` of another bucket epoch (a recreated bucket) is "
       "answered resumed: false")
async def resume_foreign(target: Target) -> str:
    cursor = await reply_cursor(target)
    try:
        epoch = Position.decode_single(cursor).epoch
    except CursorError:
        raise NotRun(f"the reply's cursor {cursor!r} is not in this implementation's format, so "
                     "no foreign cursor can be made for it") from None
    other = new_epoch()
    while other == epoch:
        other = new_epoch()
    foreign = Position.single(other, StreamId(1, 0)).encode()
    resumed = await resumed_for(target, foreign)
    expect(resumed is False, f"since={foreign} (another epoch) got resumed: {resumed!r}")
    return f"since={foreign}: resumed: false"


@check("resume-future-since", "resume", "`since` beyond the newest item of this epoch is answered "
       "resumed: false")
async def resume_future(target: Target) -> str:
    cursor = await reply_cursor(target)
    try:
        epoch = Position.decode_single(cursor).epoch
    except CursorError:
        raise NotRun(f"the reply's cursor {cursor!r} is not in this implementation's format") \
            from None
    future = Position.single(epoch, StreamId(2**46, 0)).encode()
    resumed = await resumed_for(target, future)
    expect(resumed is False, f"since={future} (beyond the log) got resumed: {resumed!r}")
    return f"since={future}: resumed: false"


BAD_SINCE = [
    Refusal("bad-since-not-a-cursor", "`since` that is no cursor: 1008 `since: invalid cursor`",
            lambda t: t.v1(since="not-a-cursor"), 1008, mentions="since"),
    Refusal("bad-since-not-a-string", "`since` that is not a string: 1008",
            lambda t: t.v1(since=12), 1008, mentions="since"),
]


def since_check(refusal: Refusal) -> None:
    async def run(target: Target) -> str:
        answer = await close_after(target.ws_url, refusal.frame(target), refusal.version,
                                   target.timeout)
        if isinstance(answer, dict) and "resumed" not in answer:
            raise NotRun("the publisher ignores `since` (its replies carry no `resumed`)")
        if isinstance(answer, Closed) or not isinstance(answer, dict):
            return judge(refusal, answer)
        raise Failed(f"accepted with resumed: {answer.get('resumed')!r}, expected a close "
                     f"with {refusal.code}")

    check(refusal.name, "resume", refusal.what)(run)


for _refusal in BAD_SINCE:
    since_check(_refusal)
