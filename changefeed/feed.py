"""The wire format of the ZeroEventHub event feed: `GET /changefeeds/feed/v1`, NDJSON with
partitions and checkpoints.

Each partition of the bucket is a stream of its own; a change is in partition
``sha1(changedResourceId)[:8 hex] mod n`` on every publisher, so one resource's changes stay in
order. A response holds event lines ``{"partition", "headers"?, "data"}`` (data: the change item)
followed by checkpoint lines ``{"partition", "cursor"}``: a client that persisted every event
before a checkpoint and passes its cursor back follows the partition exactly, with nothing missed
or repeated. docs/feed.md has the parameters.

Because every partition's ids come from one sequence, a checkpoint of a partition that was read
to its end is the bucket's head at the moment of the read: it moves on even when the partition had
nothing new, and it stays valid for whatever that partition receives later.

Pure code: the publisher answers requests in `publisher.pull.polls`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from changefeed.cursor import ZERO, Position, StreamId
from changefeed.errors import CursorError, CursorGone, ParamError
from changefeed.longpoll import PollLimits, parse_wait
from changefeed.protocol import ChangeItem

FIRST = "_first"
LAST = "_last"
ALL_HEADERS = "_all"
HEADERS = ("ce_id", "ce_type", "ce_subject", "ce_time", "ce_source")
"""The headers an event can carry (CloudEvents names): its cursor, its resource, its
changedResourceId, its publication time (RFC 3339) and the bucket's name."""
MAX_NAME = 50
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,50}$")
"""A cursorset or consumer name."""
_CURSOR_PARAM = re.compile(r"^cursor([0-9]+)$")
PARAMETERS = ("n", "pagesizehint", "headers", "wait", "cursorset", "resume", "store_cursor",
              "consumer")


@dataclass(frozen=True, slots=True)
class FeedRequest:
    n: int
    cursors: dict[int, str]
    """Input cursor per requested partition (``_first``, ``_last`` or a cursor), in order."""
    page_size: int
    headers: tuple[str, ...]
    wait: float
    cursorset: str | None
    consumer: str | None
    resume: tuple[int, ...]


def _digits(text: str) -> bool:
    """ASCII digits only: `str.isdigit` also accepts '²', which `int` refuses."""
    return text.isascii() and text.isdigit()


def parse_request(query: Mapping[str, str], limits: PollLimits) -> FeedRequest:
    """Validate the query string (pure), whose names the route has checked (`PARAMETERS` and
    `cursor0`, `cursor1`..., each at most once); ParamError names the parameter."""
    text = query.get("n")
    if text is None or not _digits(text) or int(text) < 1:
        raise ParamError("n (the number of partitions the client assumes) must be a positive "
                         "integer")
    n = int(text)
    cursors = _cursors(query, n)
    page_size = _page_size(query.get("pagesizehint"), limits)
    selected = query.get("headers", "")
    headers = tuple(h for h in selected.split(",") if h)
    if ALL_HEADERS in headers:
        headers = HEADERS
    wait = parse_wait("wait", query.get("wait"), limits)
    cursorset = query.get("cursorset")
    consumer = query.get("consumer")
    for label, given in (("cursorset", cursorset), ("consumer", consumer)):
        if given is not None and not NAME.match(given):
            raise ParamError(f"{label} must be 1 to {MAX_NAME} letters, digits, '_', '.' or '-'")
    resume: tuple[int, ...] = ()
    if "resume" in query:
        parts = query["resume"].split(",")
        if not all(_digits(p) and int(p) < n for p in parts):
            raise ParamError(f"resume must list partitions below n={n}, e.g. resume=0,1")
        resume = tuple(dict.fromkeys(int(p) for p in parts))
        if cursors:
            raise ParamError("pass either cursorN or resume, not both")
        if cursorset is None:
            raise ParamError("resume needs cursorset: the name the cursors were stored under")
    elif not cursors:
        raise ParamError("pass a cursorN for each partition to read (cursor0=_first ...)")
    if (cursorset is not None or resume) and consumer is None:
        raise ParamError("cursorset and resume need consumer=<name> (the consumer's identity)")
    return FeedRequest(
        n, dict(sorted(cursors.items())), page_size, headers, wait,
        cursorset, consumer, resume,
    )


def _cursors(query: Mapping[str, str], n: int) -> dict[int, str]:
    """The `cursorN` parameters, by partition (each below `n`)."""
    cursors: dict[int, str] = {}
    for name, value in query.items():
        match = _CURSOR_PARAM.match(name)
        if match is None:
            continue
        partition = int(match.group(1))
        if partition >= n:
            raise ParamError(f"{name}: partition {partition} is not below n={n}")
        if not value or not value.isascii() or not value.isprintable():
            raise ParamError(f"{name} must be {FIRST}, {LAST} or a cursor this feed issued")
        cursors[partition] = value
    return cursors


def _page_size(hint_text: str | None, limits: PollLimits) -> int:
    """`pagesizehint`, at most the publisher's maximum (its default when absent)."""
    if hint_text is None:
        return limits.results
    if _digits(hint_text):
        return min(int(hint_text), limits.max_results)
    raise ParamError("pagesizehint must be a non-negative integer")


def resolve(text: str, name: str, epoch: str, trimmed: StreamId, head: StreamId) -> StreamId:
    """The position an input cursor stands for. Raises ParamError or CursorGone."""
    if text == FIRST:
        return ZERO
    if text == LAST:
        return head
    try:
        cursor = Position.decode_single(text)
    except CursorError:
        raise ParamError(f"{name} must be {FIRST}, {LAST} or a cursor this feed issued") from None
    if cursor.epoch != epoch:
        raise CursorGone(f"{name} is of another bucket epoch (the bucket was recreated): start "
                         f"again from {FIRST}")
    if cursor.position < trimmed:
        raise CursorGone(f"{name} is older than the retained log (items after it were trimmed "
                         f"by maxAge/maxItems): start again from {FIRST}")
    return cursor.position


def event_line(partition: int, item: ChangeItem, bucket: str, headers: Sequence[str]) -> bytes:
    """One event line: the partition, the chosen headers, and the change item as `data`."""
    line: dict[str, Any] = {"partition": partition}
    if headers:
        available = {
            "ce_id": item.cursor,
            "ce_type": item.resource,
            "ce_subject": item.changed_resource_id,
            "ce_time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(item.published / 1000))
            + f".{item.published % 1000:03d}Z",
            "ce_source": bucket,
        }
        line["headers"] = {h: available[h] for h in headers if h in available}
    line["data"] = item.to_wire()
    return orjson.dumps(line) + b"\n"


def checkpoint_line(partition: int, cursor: str) -> bytes:
    return orjson.dumps({"partition": partition, "cursor": cursor}) + b"\n"


__all__ = ["ALL_HEADERS", "FIRST", "HEADERS", "LAST", "NAME", "FeedRequest", "checkpoint_line",
           "event_line", "parse_request", "resolve"]
