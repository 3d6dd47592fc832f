"""The values the bucket takes and gives: changes in, log entries, pages and commits out.

Pure code: nothing here talks to Redis, so the merge of partitions and the content digest of
idempotent commits are tested without a server.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from changefeed.cursor import Position, StreamId
from changefeed.errors import ChangeError
from changefeed.protocol import ChangeItem
from changefeed.watch import MAX_ID_BYTES

Op = Literal["put", "delete", "publish"]


@dataclass(frozen=True, slots=True)
class Change:
    """One change to commit: `put` stores `state`, `delete` removes it, `publish` stores nothing."""

    resource: str
    changed_resource_id: str
    sub_resources: tuple[str, ...]
    op: Op = "publish"
    state: Any = None

    def __post_init__(self) -> None:
        if self.op == "put" and type(self.state) is not dict:
            given = _encoded_type(self.state)
            if given is not None and given != "object":
                raise state_refused(self.resource, self.changed_resource_id, given)

    @classmethod
    def put(cls, resource: str, id: str, sub_resources: Sequence[str], state: Any) -> Change:
        return cls(resource, id, tuple(sub_resources), "put", state)

    @classmethod
    def delete(cls, resource: str, id: str, sub_resources: Sequence[str]) -> Change:
        return cls(resource, id, tuple(sub_resources), "delete")

    @classmethod
    def publish(cls, resource: str, id: str, sub_resources: Sequence[str]) -> Change:
        return cls(resource, id, tuple(sub_resources), "publish")


def state_refused(resource: str, id: str, given: str) -> ChangeError:
    """The error of a put whose state is not a JSON object, `given` being the JSON type it has
    (`null` for none): one form on every path (`Change`, the Spark sink's rows, the outbox's
    rows and its SQL functions, which spell it out again)."""
    hint = " (a change without a state is a publish)" if given == "null" else ""
    return ChangeError(
        f"{resource} {id!r}: a put's state must be a JSON object, got {given}{hint}"
    )


def object_state(resource: str, id: str, state: bytes) -> bytes:
    """`state` (a put's state, as JSON) if it is an object, else `state_refused`'s error."""
    if state[:1] == b"{" or state.lstrip()[:1] == b"{":
        return state
    raise state_refused(resource, id, json_type(state))


def json_type(encoded: bytes) -> str:
    """The JSON type of the JSON text `encoded` (as PostgreSQL's `jsonb_typeof` names it)."""
    first = encoded.lstrip()[:1]
    return _JSON_TYPES.get(first, "number" if first else "nothing")


_JSON_TYPES = {b"{": "object", b"[": "array", b'"': "string", b"t": "boolean",
               b"f": "boolean", b"n": "null"}


def _encoded_type(state: Any) -> str | None:
    """The JSON type `state` encodes to (None: orjson cannot encode it, which the commit's
    encoding reports)."""
    try:
        return json_type(orjson.dumps(state))
    except orjson.JSONEncodeError:
        return None


@dataclass(frozen=True, slots=True)
class LogEntry:
    """A change item as stored in the log."""

    position: StreamId
    resource: str
    sub_resources: tuple[str, ...]
    changed_resource_id: str

    def item(self, epoch: str) -> ChangeItem:
        return ChangeItem(
            self.resource,
            self.sub_resources,
            self.changed_resource_id,
            self.position.ms,
            Position.single(epoch, self.position).encode(),
        )


@dataclass(frozen=True, slots=True)
class Retention:
    """What the log retains: resumable positions are those >= `trimmed`, up to `head`."""

    epoch: str | None
    trimmed: StreamId
    head: StreamId
    oldest: StreamId | None


@dataclass(frozen=True, slots=True)
class LogRead:
    """Entries after a position and, from the same atomic snapshot, what they are checked against.

    The tail and resume replays read through this so that a trimmed gap (`trimmed` past the
    position), a rollback (`head` behind it, or the entry at it gone untrimmed) and a new epoch
    are seen in the very read that would otherwise skip over them, with no second round trip.
    """

    entries: list[LogEntry]
    complete: bool
    """Every partition was read to its end: nothing follows the last entry (at that instant)."""
    epoch: str | None
    partitions: int | None
    """The stored partition count (None: the key is absent)."""
    head: StreamId
    trimmed: StreamId
    witnessed: bool
    """The entry at the position read after is still in the log (True when it could not be:
    the position is 0-0 or at or before the trimmed horizon)."""
    length: int
    """Entries in the log now."""
    added: int | None
    """Entries ever appended to the log (Redis >= 7 counts them; None before)."""


@dataclass(frozen=True, slots=True)
class StatePage:
    """One page of a resource's stored states, in id order."""

    ids: list[str]
    states: list[bytes]
    """Each state as committed, as JSON bytes (not decoded again)."""
    cursor: Position | None
    """The bucket head when the page was read (None before the bucket has an epoch)."""


@dataclass(frozen=True, slots=True)
class Piece:
    """One id (`end` None) or a ZRANGEBYLEX range `start`..`end` of a resource's index: what a
    page walks, in id order (`ChangeBucket.page_pieces`)."""

    start: str
    end: str | None = None

    def arguments(self) -> list[str]:
        return ["id", self.start, ""] if self.end is None else ["range", self.start, self.end]


@dataclass(frozen=True, slots=True)
class Committed:
    """What one atomic commit (one script call) gave the changes: positions ms-first ..
    ms-(first + count - 1) in the bucket of epoch `epoch`.

    `fresh` is False when the commit's idempotency key was already known: nothing was written
    now, and the positions are those of the commit that first used the key. `renewed` is True
    when this commit found the bucket rolled back behind what this client had been acknowledged,
    and started a new epoch before writing.
    """

    epoch: str
    ms: int
    first: int
    count: int
    fresh: bool = True
    renewed: bool = False
    parts: tuple[Committed, ...] = ()
    """A call of several transactions (`pack_group`): what each one got, in order (its
    `fresh` False when it was skipped, its key known); the call's own figures are those of the
    changes written now."""

    @property
    def cursors(self) -> list[str]:
        return Position.run(self.epoch, self.ms, self.first, self.count)

    @property
    def first_cursor(self) -> str | None:
        first = StreamId(self.ms, self.first)
        return Position.single(self.epoch, first).encode() if self.count else None

    @property
    def last_cursor(self) -> str | None:
        last = StreamId(self.ms, self.first + self.count - 1)
        return Position.single(self.epoch, last).encode() if self.count else None


def digest_of(changes: Sequence[Change]) -> str:
    """A digest of `changes`, in order: what an idempotency key is checked against, so that a key
    used again for other changes is refused rather than answered with another commit's cursors.

    It is the digest of the changes as the commit script takes them (`pack_changes`), so a writer
    that sends encoded changes (`commit_stream`) and one that sends `Change`s agree."""
    return pack_change_values(changes).digest()


Encoded = tuple[Op, str, str, bytes, bytes]
"""A change encoded for the commit script, as a writer that makes many builds it without a
`Change`: (op, resource, id, sub-resources as a JSON array, state as JSON or b"" unless put)."""


def encode_change(change: Change) -> Encoded:
    """`change` as the commit script takes it."""
    subs = change.sub_resources
    subs_json = _SUBS_JSON.get(subs) if type(subs) is tuple else None
    if subs_json is None:
        subs_json = _subs_json(subs)
    state = orjson.dumps(change.state) if change.op == "put" else b""
    return (change.op, change.resource, change.changed_resource_id, subs_json, state)


def _subs_json(subs: Sequence[str]) -> bytes:
    """`subs` as a JSON array, remembered when it is a tuple (`_SUBS_JSON`)."""
    subs_json = orjson.dumps(list(subs))
    if type(subs) is tuple and len(_SUBS_JSON) < _SUBS_REMEMBERED:
        _SUBS_JSON[subs] = subs_json
    return subs_json


_SUBS_JSON: dict[tuple[str, ...], bytes] = {}
"""Sub-resource lists as JSON: a writer sends the same few lists over and over."""
_SUBS_REMEMBERED = 4096


_OP_LETTERS: dict[str, str] = {"put": "p", "delete": "d", "publish": "u"}
"""The letter of each op in a change's code in commit.lua's arguments."""


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


@dataclass(frozen=True, slots=True)
class PackedChanges:
    """The changes of one commit.lua call, packed as the script takes them: the resources of the
    batch in the order they first appear (the script gets each one's state and index key, in
    that order, after the common keys), and the ARGV after the six fixed ones, as RESP bulk
    strings ready to be written to the socket: each resource's name, then four per change, its
    code (the op's letter and the resource's number: `p1`), id, sub-resources JSON and state
    JSON (empty unless a put).

    Packed once, by hand, because a writer of many changes would otherwise spend more CPU in
    redis-py's per-argument packing than Redis spends running the script. A resource's name and
    keys go once per batch, not once per change.

    A call of several transactions (`pack_group`) holds `parts` of them: after the names, four
    arguments per transaction (its key, digest, number of changes and resource numbers), then
    their changes, each coded by its own transaction's resources."""

    resources: list[str]
    args: bytes
    count: int
    """How many changes."""
    head: int = 0
    """The bytes of `args` that name the resources (the changes follow)."""
    parts: int = 0
    """How many transactions a call of several holds (0: one, named by the call's key)."""

    @property
    def arg_count(self) -> int:
        """How many bulk strings `args` holds."""
        return len(self.resources) + 4 * self.count + 4 * self.parts

    def digest(self) -> str:
        """The digest of the changes: what their idempotency key is checked against."""
        return hashlib.blake2b(self.args, digest_size=16).hexdigest()


def pack_changes(changes: Sequence[Encoded]) -> PackedChanges:
    """`changes` (not validated here) as one commit.lua call takes them: see `PackedChanges`."""
    codes: dict[str, dict[str, bytes]] = {}
    parts: list[bytes] = []
    append = parts.append
    for op, resource, id, subs, state in changes:
        known = codes.get(resource)
        if known is None:
            known = codes[resource] = _codes(len(codes) + 1)
        raw = id.encode()
        append(
            b"%s$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n"
            % (known[op], len(raw), raw, len(subs), subs, len(state), state)
        )
    names = b"".join(_bulk(resource.encode()) for resource in codes)
    return PackedChanges(list(codes), names + b"".join(parts), len(changes), len(names))


def pack_group(parts: Sequence[tuple[PackedChanges, str]]) -> PackedChanges:
    """Several transactions, each packed alone (`pack_changes`: so its digest is the one it has
    committed alone) with its idempotency key ('' for none), as one commit.lua call that applies
    each atomically under its key, in order (see `PackedChanges`)."""
    numbers: dict[str, int] = {}
    described: list[bytes] = []
    for packed, key in parts:
        own = b" ".join(b"%d" % numbers.setdefault(r, len(numbers) + 1) for r in packed.resources)
        raw = key.encode()
        digest = packed.digest().encode() if key else b""
        described.append(b"$%d\r\n%s\r\n$%d\r\n%s\r\n%s$%d\r\n%s\r\n" % (
            len(raw), raw, len(digest), digest, _bulk(b"%d" % packed.count), len(own), own))
    names = b"".join(_bulk(resource.encode()) for resource in numbers)
    args = b"".join([names, *described, *(packed.args[packed.head:] for packed, _ in parts)])
    return PackedChanges(list(numbers), args, sum(packed.count for packed, _ in parts),
                         len(names), len(parts))


def pack_change_values(changes: Sequence[Change]) -> PackedChanges:
    """`changes` (validated or not) encoded and packed in one pass: what
    `pack_changes([encode_change(c) for c in changes])` gives, byte for byte, for a third of the
    CPU. Each state's JSON is copied into its change's packed bytes and dropped at once: a batch
    that keeps hundreds of orjson's results alive (a list of `Encoded`) costs the allocator
    several µs per change, more than the encoding itself. The bulk strings' headers are looked
    up (`_HEADS`), the sub-resources' bulk string packed once per list (`_SUBS_BULK`)."""
    codes: dict[str, dict[str, bytes]] = {}
    parts: list[bytes] = []
    append = parts.append
    join = b"".join
    dumps = orjson.dumps
    heads = _HEADS
    known_subs = _SUBS_BULK
    for change in changes:
        resource = change.resource
        known = codes.get(resource)
        if known is None:
            known = codes[resource] = _codes(len(codes) + 1)
        subs = change.sub_resources
        subs_bulk = known_subs.get(subs) if type(subs) is tuple else None
        if subs_bulk is None:
            subs_bulk = _bulk(_subs_json(subs))
            if type(subs) is tuple and len(known_subs) < _SUBS_REMEMBERED:
                known_subs[subs] = subs_bulk
        op = change.op
        raw = change.changed_resource_id.encode()
        size = len(raw)
        id_head = heads[size] if size < _HEADS_KNOWN else b"$%d\r\n" % size
        if op == "put":
            state = dumps(change.state)
            size = len(state)
            state_head = heads[size] if size < _HEADS_KNOWN else b"$%d\r\n" % size
            append(join((known[op], id_head, raw, b"\r\n", subs_bulk, state_head, state,
                         b"\r\n")))
        else:
            append(join((known[op], id_head, raw, b"\r\n", subs_bulk, b"$0\r\n\r\n")))
    names = b"".join(_bulk(resource.encode()) for resource in codes)
    return PackedChanges(list(codes), names + b"".join(parts), len(changes), len(names))


_HEADS_KNOWN = 4096
_HEADS = [b"$%d\r\n" % size for size in range(_HEADS_KNOWN)]
"""The header of a bulk string of each length below _HEADS_KNOWN."""
_SUBS_BULK: dict[tuple[str, ...], bytes] = {}
"""Sub-resource lists as packed bulk strings of their JSON (`pack_change_values`)."""


_CODES: list[dict[str, bytes]] = []
"""The packed codes of each op, by resource number - 1."""


def _codes(number: int) -> dict[str, bytes]:
    """op -> its code for the `number`th resource of a batch, packed (`p1`, `d1`, `u1`)."""
    while len(_CODES) < number:
        n = len(_CODES) + 1
        _CODES.append({op: _bulk(f"{letter}{n}".encode()) for op, letter in _OP_LETTERS.items()})
    return _CODES[number - 1]


def unpack_bulk(data: bytes) -> list[bytes]:
    """The bulk strings of `data` (as `PackedChanges.args` holds them), for a client that passes
    arguments one by one."""
    out: list[bytes] = []
    at = 0
    while at < len(data):
        end = data.index(b"\r\n", at)
        length = int(data[at + 1 : end])
        out.append(data[end + 2 : end + 2 + length])
        at = end + 4 + length
    return out


def parse_entry(entry_id: bytes, fields: dict[bytes, bytes]) -> LogEntry:
    return LogEntry(
        StreamId.parse(entry_id),
        fields[b"r"].decode(),
        tuple(orjson.loads(fields[b"s"])),
        fields[b"i"].decode(),
    )


def merge_partitions(
    parts: Sequence[Sequence[LogEntry]], count: int, *, newest_first: bool = False
) -> list[LogEntry]:
    """Up to `count` entries of the partitions' reads in id order, never past a gap.

    Each part is one partition's read of at most `count` entries, in the given order. A part that
    came back full may have more entries beyond its last, so the merge stops there: what it
    returns is exactly the first `count` entries (or all) of the log in that order.
    """
    full = [part[-1].position for part in parts if len(part) >= count]
    bound = (max(full) if newest_first else min(full)) if full else None
    merged = heapq.merge(*parts, key=_position, reverse=newest_first)
    out: list[LogEntry] = []
    for entry in merged:
        if bound is not None and (
            entry.position < bound if newest_first else entry.position > bound
        ):
            break
        out.append(entry)
        if len(out) == count:
            break
    return out


def _position(entry: LogEntry) -> StreamId:
    return entry.position


__all__ = [
    "MAX_ID_BYTES",
    "Change",
    "Committed",
    "Encoded",
    "LogEntry",
    "LogRead",
    "Op",
    "PackedChanges",
    "Piece",
    "Retention",
    "StatePage",
    "digest_of",
    "encode_change",
    "json_type",
    "merge_partitions",
    "object_state",
    "pack_change_values",
    "pack_changes",
    "pack_group",
    "parse_entry",
    "state_refused",
    "unpack_bulk",
]
