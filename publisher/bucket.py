"""The change bucket and the authoritative store, in Redis.

Keys (all under one hash tag, so a Redis Cluster keeps them in one slot)::

    {name}:log              stream: one entry per change item (fields r, s, i)
    {name}:epoch            string: the bucket's epoch, created with the bucket
    {name}:trimmed          string: the newest stream id ever trimmed (resume horizon)
    {name}:state:<resource> hash: id -> the resource's state, as committed (JSON)
    {name}:index:<resource> sorted set, all scores 0: ids, for keyset pagination by id

`commit` writes the state and appends the item in one Lua script, so the store and the bucket
never disagree. `trim` removes items older than maxAge and records the horizon; it is idempotent,
so every publisher on a bucket may run it.

Errors of redis-py are translated into `BucketUnavailable` here and nowhere else.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from changefeed.cursor import Cursor, StreamId, new_epoch
from changefeed.errors import BucketUnavailable, ChangeError, ChangefeedError, PartitionMismatch
from changefeed.protocol import ChangeItem, Resource

MAX_ID_BYTES = 512
BATCH = 500
"""Changes per Lua call in commit_many: keeps Redis responsive between calls."""
TRIM_BATCH = 10000
"""Most items one trim call removes for `maxItems` (the rest go in the next call)."""

Op = Literal["put", "delete", "publish"]


@dataclass(frozen=True, slots=True)
class Change:
    """One change to commit: `put` stores `state`, `delete` removes it, `publish` stores nothing."""

    resource: str
    changed_resource_id: str
    sub_resources: tuple[str, ...]
    op: Op = "publish"
    state: Any = None

    @classmethod
    def put(cls, resource: str, id: str, sub_resources: Sequence[str], state: Any) -> Change:
        return cls(resource, id, tuple(sub_resources), "put", state)

    @classmethod
    def delete(cls, resource: str, id: str, sub_resources: Sequence[str]) -> Change:
        return cls(resource, id, tuple(sub_resources), "delete")

    @classmethod
    def publish(cls, resource: str, id: str, sub_resources: Sequence[str]) -> Change:
        return cls(resource, id, tuple(sub_resources), "publish")


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
            Cursor(epoch, self.position).encode(),
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
class Page:
    """One page of a resource's stored states, in id order."""

    ids: list[str]
    states: list[bytes]
    """Each state as committed, as JSON bytes (not decoded again)."""
    cursor: Cursor | None
    """The bucket head when the page was read (None before the bucket has an epoch)."""


class Keys:
    """The Redis key names of one bucket."""

    def __init__(self, name: str) -> None:
        tag = "{" + name + "}"
        self.log = f"{tag}:log"
        """The log (one partition), or the prefix of the partition streams `log:<p>`."""
        self.epoch = f"{tag}:epoch"
        self.partitions = f"{tag}:partitions"
        self.last = f"{tag}:last"
        self.trimmed = f"{tag}:trimmed"
        self._tag = tag

    @property
    def common(self) -> list[str]:
        """The first KEYS of every script: log, epoch, partitions, last, trimmed."""
        return [self.log, self.epoch, self.partitions, self.last, self.trimmed]

    def stream(self, partition: int, partitions: int) -> str:
        """The stream holding partition `partition` of a log split into `partitions`."""
        return self.log if partitions == 1 else f"{self.log}:{partition}"

    def state(self, resource: str) -> str:
        return f"{self._tag}:state:{resource}"

    def index(self, resource: str) -> str:
        return f"{self._tag}:index:{resource}"

    def cursorset(self, consumer: str) -> str:
        return f"{self._tag}:cursorset:{consumer}"


def partition_of(changed_resource_id: str, partitions: int) -> int:
    """The partition of a change: the first 32 bits of SHA-1(id) mod `partitions`, exactly as
    COMMIT_LUA computes it, so every publisher and Spark job agrees."""
    digest = hashlib.sha1(changed_resource_id.encode()).hexdigest()
    return int(digest[:8], 16) % partitions


# Functions every script starts with. KEYS[1..5] are Keys.common. The partition streams are
# derived from KEYS[1] (all in the bucket's hash slot).
LUA_LIB = """
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function less(a, b)
  local am, as = parse(a)
  local bm, bs = parse(b)
  return am < bm or (am == bm and as < bs)
end
local function stream(n, p)
  if n == 1 then return KEYS[1] end
  return KEYS[1] .. ':' .. p
end
local function partitions()
  return tonumber(redis.call('GET', KEYS[3]) or '1')
end
local function head(n)
  local last = redis.call('GET', KEYS[4])
  if last then return last end
  local best = redis.call('GET', KEYS[5]) or '0-0'
  for p = 0, n - 1 do
    local top = redis.call('XREVRANGE', stream(n, p), '+', '-', 'COUNT', 1)
    if #top > 0 and less(best, top[1][1]) then best = top[1][1] end
  end
  return best
end
-- The partition count, created with the bucket (ARGV wanted: a number, or '' for the bucket's).
-- Returns nil and an error when the bucket was created with another count.
local function ensure(candidate_epoch, wanted)
  wanted = tonumber(wanted)
  local n = tonumber(redis.call('GET', KEYS[3]) or '0')
  if n == 0 then
    n = wanted or 1
    if redis.call('EXISTS', KEYS[2]) == 1 then n = 1 end
  end
  if wanted and wanted ~= n then
    return nil, 'PARTITIONS the bucket has ' .. n .. ' partition(s), not ' .. wanted
  end
  if redis.call('EXISTS', KEYS[3]) == 0 then redis.call('SET', KEYS[3], n) end
  redis.call('SET', KEYS[2], candidate_epoch, 'NX')
  if not redis.call('GET', KEYS[4]) then redis.call('SET', KEYS[4], head(n)) end
  return n
end
"""

# KEYS: common, then (state, index) per change.
# ARGV: candidate epoch, wanted partitions, then (op, resource, sub-resources as JSON, id, state
# JSON) per change. Returns {epoch, ms, first seq, count}: the changes' ids are ms-(first seq),
# ms-(first seq + 1), ... in order. Ids come from one sequence for every partition (`last`), so
# they order every change of the bucket, whatever its partition.
COMMIT_LUA = LUA_LIB + """
local n, problem = ensure(ARGV[1], ARGV[2])
if not n then return redis.error_reply(problem) end
local call = redis.call
local lms, lseq = parse(call('GET', KEYS[4]))
local t = call('TIME')
local ms, seq = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), -1
if ms <= lms then ms, seq = lms, lseq end
local first, count = seq + 1, (#ARGV - 2) / 5
local prefix = string.format('%d-', ms)
for j = 0, count - 1 do
  local a = 3 + j * 5
  local op, changed = ARGV[a], ARGV[a + 3]
  if op == 'put' then
    call('HSET', KEYS[6 + j * 2], changed, ARGV[a + 4])
    call('ZADD', KEYS[7 + j * 2], 0, changed)
  elseif op == 'delete' then
    call('HDEL', KEYS[6 + j * 2], changed)
    call('ZREM', KEYS[7 + j * 2], changed)
  end
  local target = KEYS[1]
  if n > 1 then
    target = target .. ':' .. (tonumber(string.sub(redis.sha1hex(changed), 1, 8), 16) % n)
  end
  seq = seq + 1
  call('XADD', target, prefix .. string.format('%d', seq), 'r', ARGV[a + 1], 's', ARGV[a + 2],
       'i', changed)
end
if count > 0 then call('SET', KEYS[4], prefix .. string.format('%d', seq)) end
return {call('GET', KEYS[2]), string.format('%d', ms), first, count}
"""

# KEYS: common. ARGV: candidate epoch, wanted partitions. Returns {epoch, partitions}.
ENSURE_LUA = LUA_LIB + """
local n, problem = ensure(ARGV[1], ARGV[2])
if not n then return redis.error_reply(problem) end
return {redis.call('GET', KEYS[2]), n}
"""

# KEYS: common. ARGV: max age in ms (0: none), max items (0: none), most items to remove for the
# count in one call. Removes the items older than max age by Redis' own clock and the oldest
# beyond max items, across every partition, and raises the trimmed horizon to the newest id
# removed. Returns {removed, 1 when more must go for the count else 0}.
TRIM_LUA = LUA_LIB + """
local n = partitions()
local max_age, max_items, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local cutoff = nil
if max_age > 0 then
  local t = redis.call('TIME')
  local min_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - max_age
  if min_ms > 0 then
    for p = 0, n - 1 do
      local last = redis.call('XREVRANGE', stream(n, p), '(' .. min_ms .. '-0', '-', 'COUNT', 1)
      if #last > 0 and (cutoff == nil or less(cutoff, last[1][1])) then cutoff = last[1][1] end
    end
  end
end
local more = 0
if max_items > 0 then
  local total = 0
  for p = 0, n - 1 do total = total + redis.call('XLEN', stream(n, p)) end
  local excess = total - max_items
  if excess > most then excess, more = most, 1 end
  if excess > 0 then
    local heads, at = {}, {}
    for p = 0, n - 1 do
      heads[p] = redis.call('XRANGE', stream(n, p), '-', '+', 'COUNT', excess)
      at[p] = 1
    end
    local oldest
    for _ = 1, excess do
      local pick = nil
      for p = 0, n - 1 do
        local entry = heads[p][at[p]]
        if entry and (pick == nil or less(entry[1], heads[pick][at[pick]][1])) then pick = p end
      end
      oldest = heads[pick][at[pick]][1]
      at[pick] = at[pick] + 1
    end
    if cutoff == nil or less(cutoff, oldest) then cutoff = oldest end
  end
end
if cutoff == nil then return {0, more} end
local ms, seq = parse(cutoff)
local minid = string.format('%d-%d', ms, seq + 1)
local removed = 0
for p = 0, n - 1 do
  removed = removed + redis.call('XTRIM', stream(n, p), 'MINID', minid)
end
local old = redis.call('GET', KEYS[5])
if old == false or less(old, cutoff) then redis.call('SET', KEYS[5], cutoff) end
return {removed, more}
"""

# KEYS: common. Returns {epoch, trimmed, head id, oldest id, partitions}.
RETENTION_LUA = LUA_LIB + """
local n = partitions()
local oldest = ''
for p = 0, n - 1 do
  local first = redis.call('XRANGE', stream(n, p), '-', '+', 'COUNT', 1)
  if #first > 0 and (oldest == '' or less(first[1][1], oldest)) then oldest = first[1][1] end
end
local trimmed = redis.call('GET', KEYS[5]) or '0-0'
return {redis.call('GET', KEYS[2]) or '', trimmed, head(n), oldest, n}
"""

# KEYS: common. ARGV: position (exclusive), most entries per partition (0: none), partition count
# to read. Returns {epoch, stored partition count, head, trimmed, 1 if the entry at the position
# is still there (or cannot be, at or before trimmed) else 0, length, entries ever added (-1:
# unknown), then one XRANGE reply per partition}: one snapshot.
TAIL_LUA = LUA_LIB + """
local after, count, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local trimmed = redis.call('GET', KEYS[5]) or '0-0'
local witnessed = 1
if after ~= '0-0' and less(trimmed, after) then witnessed = 0 end
local length, added, uncounted = 0, 0, false
local reads = {}
for p = 0, n - 1 do
  local s = stream(n, p)
  if redis.call('EXISTS', s) == 1 then
    local info, counted = redis.call('XINFO', 'STREAM', s), false
    for i = 1, #info, 2 do
      if info[i] == 'length' then length = length + info[i + 1] end
      if info[i] == 'entries-added' then added, counted = added + info[i + 1], true end
    end
    uncounted = uncounted or not counted
    if witnessed == 0 and #redis.call('XRANGE', s, after, after) > 0 then witnessed = 1 end
  end
  reads[p + 1] = {}
  if count > 0 then reads[p + 1] = redis.call('XRANGE', s, '(' .. after, '+', 'COUNT', count) end
end
if uncounted then added = -1 end
local out = {redis.call('GET', KEYS[2]) or '', redis.call('GET', KEYS[3]) or '', head(n), trimmed,
             witnessed, length, added}
for p = 1, n do out[#out + 1] = reads[p] end
return out
"""

# KEYS: common. ARGV: the epoch the caller knows, a new one. Replaces the epoch only while it is
# still the caller's, so several publishers noticing one rollback start one new epoch. Returns the
# epoch ('' when the bucket has none).
RENEW_EPOCH_LUA = """
local current = redis.call('GET', KEYS[2])
if current == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2])
  return ARGV[2]
end
return current or ''
"""

# KEYS: common, index, state. ARGV: ZRANGEBYLEX start, limit.
# Returns {ids, states, head id, epoch}: one consistent snapshot.
PAGE_LUA = LUA_LIB + """
local ids = redis.call('ZRANGEBYLEX', KEYS[6], ARGV[1], '+', 'LIMIT', 0, tonumber(ARGV[2]))
local states = {}
if #ids > 0 then states = redis.call('HMGET', KEYS[7], unpack(ids)) end
return {ids, states, head(partitions()), redis.call('GET', KEYS[2]) or ''}
"""


@asynccontextmanager
async def translate_redis_errors(what: str) -> AsyncIterator[None]:
    """The one place where redis-py's errors become ours."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        raise BucketUnavailable(f"{what}: Redis unreachable ({exc})", exc) from exc
    except redis.exceptions.ResponseError as exc:
        if str(exc).startswith("PARTITIONS "):
            raise PartitionMismatch(
                f"bucket.partitions: {str(exc).removeprefix('PARTITIONS ')} (the partition "
                "count is fixed when the bucket is created)"
            ) from None
        raise ChangefeedError(f"{what}: Redis error ({exc})") from exc
    except redis.exceptions.RedisError as exc:
        raise ChangefeedError(f"{what}: Redis error ({exc})") from exc


def connect(url: str, *, blocking: bool = False) -> aioredis.Redis:
    """A redis-py client for `url` that never retries on its own (commits are not idempotent).

    `blocking` clients wait longer for a reply, for XREAD BLOCK (which waits at most 5 s).
    """
    return aioredis.Redis.from_url(
        url,
        retry=Retry(NoBackoff(), 0),
        socket_connect_timeout=5,
        socket_timeout=20 if blocking else 10,
        health_check_interval=0,
    )


def encode_marker(last_id: str) -> str:
    """The opaque keyset marker of the page after `last_id`."""
    return base64.urlsafe_b64encode(last_id.encode()).decode().rstrip("=")


def decode_marker(marker: str) -> str:
    """The id a marker stands for; ValueError when it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(marker + "=" * (-len(marker) % 4))
        text = raw.decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("not a marker issued by this route") from None
    if not text or len(raw) > MAX_ID_BYTES or encode_marker(text) != marker:
        raise ValueError("not a marker issued by this route")
    return text


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


class ChangeBucket:
    """Commits changes, reads the log and the store, and trims: one bucket in one Redis.

    `partitions` is the partition count the bucket must have (the configured one); None accepts
    whatever the bucket was created with (1 for a new bucket).
    """

    def __init__(
        self,
        client: aioredis.Redis,
        name: str,
        resources: Iterable[Resource] | None = None,
        partitions: int | None = None,
    ) -> None:
        self.redis = client
        self.keys = Keys(name)
        self.name = name
        self.resources = {r.resource: r for r in resources} if resources is not None else None
        self.partitions = partitions
        self._known_partitions: int | None = None
        self._commit = client.register_script(COMMIT_LUA)
        self._ensure = client.register_script(ENSURE_LUA)
        self._trim = client.register_script(TRIM_LUA)
        self._retention = client.register_script(RETENTION_LUA)
        self._page = client.register_script(PAGE_LUA)
        self._tail = client.register_script(TAIL_LUA)
        self._renew_epoch = client.register_script(RENEW_EPOCH_LUA)

    # --- writing -------------------------------------------------------------------------

    def validate(self, change: Change) -> None:
        """Raise ChangeError if `change` does not fit the configured resources."""
        if not isinstance(change.changed_resource_id, str) or not change.changed_resource_id:
            raise ChangeError("changedResourceId must be a non-empty string")
        if len(change.changed_resource_id.encode()) > MAX_ID_BYTES:
            raise ChangeError(f"changedResourceId longer than {MAX_ID_BYTES} bytes")
        if not change.sub_resources or not all(isinstance(s, str) for s in change.sub_resources):
            raise ChangeError("a change needs at least one sub-resource name")
        if self.resources is None:
            return
        resource = self.resources.get(change.resource)
        if resource is None:
            known = ", ".join(sorted(self.resources))
            raise ChangeError(f"unknown resource {change.resource!r} (known: {known})")
        unknown = [s for s in change.sub_resources if s not in resource.sub_resources]
        if unknown:
            raise ChangeError(
                f"unknown sub-resource(s) {', '.join(map(repr, unknown))} of {change.resource!r} "
                f"(known: {', '.join(resource.sub_resources)})"
            )

    def commit_arguments(self, changes: Sequence[Change]) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of COMMIT_LUA for `changes` (validated). Shared with the Spark sink."""
        keys = self.keys.common
        args: list[Any] = [new_epoch(), self.partitions or ""]
        for change in changes:
            self.validate(change)
            keys += [self.keys.state(change.resource), self.keys.index(change.resource)]
            state = orjson.dumps(change.state) if change.op == "put" else b""
            args += [
                change.op,
                change.resource,
                orjson.dumps(list(change.sub_resources)),
                change.changed_resource_id,
                state,
            ]
        return keys, args

    @staticmethod
    def cursors_of(reply: Sequence[Any]) -> list[str]:
        """The cursors of COMMIT_LUA's reply {epoch, ms, first seq, count}."""
        epoch, ms, first, count = reply
        return Cursor.run(epoch.decode(), int(ms), int(first), int(count))

    async def commit_many(self, changes: Iterable[Change]) -> list[str]:
        """Commit changes atomically per batch of BATCH, in order; returns their cursors."""
        changes = list(changes)
        cursors: list[str] = []
        for start in range(0, len(changes), BATCH):
            keys, args = self.commit_arguments(changes[start : start + BATCH])
            async with translate_redis_errors("commit"):
                reply = await self._commit(keys=keys, args=args)
            cursors += self.cursors_of(reply)
        return cursors

    async def commit(
        self,
        resource: str,
        id: str,
        sub_resources: Sequence[str],
        state: Any = None,
        *,
        delete: bool = False,
    ) -> str:
        """Store `state` (or delete it) and append the change item atomically; return its cursor."""
        change = (
            Change.delete(resource, id, sub_resources)
            if delete
            else Change.put(resource, id, sub_resources, state)
        )
        return (await self.commit_many([change]))[0]

    async def publish(self, resource: str, id: str, sub_resources: Sequence[str]) -> str:
        """Append a change item only (the service's store lives elsewhere). Returns the cursor."""
        return (await self.commit_many([Change.publish(resource, id, sub_resources)]))[0]

    async def publish_many(self, changes: Iterable[tuple[str, str, Sequence[str]]]) -> list[str]:
        return await self.commit_many(Change.publish(r, i, s) for r, i, s in changes)

    # --- the bucket's identity -----------------------------------------------------------

    async def ensure(self) -> str:
        """The bucket's epoch, creating the bucket (epoch and partition count) if it has none.

        Raises PartitionMismatch when the bucket was created with another partition count.
        """
        async with translate_redis_errors("epoch"):
            epoch, partitions = await self._ensure(
                keys=self.keys.common, args=[new_epoch(), self.partitions or ""]
            )
        self._known_partitions = int(partitions)
        return str(epoch.decode())

    async def current_epoch(self) -> str | None:
        """The bucket's epoch, or None when the bucket does not exist (yet, or any more)."""
        async with translate_redis_errors("epoch"):
            epoch: Any = await self.redis.get(self.keys.epoch)
        if epoch is None:
            self._known_partitions = None
        return epoch.decode() if epoch else None

    async def partition_count(self) -> int:
        """How many partitions the log has (learnt from the bucket once it exists)."""
        if self._known_partitions is None:
            async with translate_redis_errors("partitions"):
                stored = await self.redis.get(self.keys.partitions)
            if stored is None:
                return self.partitions or 1
            self._known_partitions = int(stored)
        return self._known_partitions

    async def streams(self) -> list[str]:
        """The partition streams, partition 0 first."""
        n = await self.partition_count()
        return [self.keys.stream(p, n) for p in range(n)]

    async def retention(self) -> Retention:
        async with translate_redis_errors("retention"):
            epoch, trimmed, head, oldest, _ = await self._retention(keys=self.keys.common)
        return Retention(
            epoch.decode() or None,
            StreamId.parse(trimmed),
            StreamId.parse(head),
            StreamId.parse(oldest) if oldest else None,
        )

    async def head_cursor(self) -> Cursor | None:
        """The bucket's head as a cursor (None before the bucket has an epoch)."""
        retention = await self.retention()
        return Cursor(retention.epoch, retention.head) if retention.epoch else None

    # --- reading the log -----------------------------------------------------------------

    async def read(
        self, after: StreamId, until: StreamId | None = None, count: int = 1000
    ) -> list[LogEntry]:
        """Entries after `after` (exclusive) up to `until` (inclusive), oldest first."""
        streams = await self.streams()
        end = str(until) if until else "+"
        async with translate_redis_errors("read"):
            if len(streams) == 1:
                rows: Any = await self.redis.xrange(streams[0], f"({after}", end, count=count)
                return [parse_entry(entry_id, fields) for entry_id, fields in rows]
            pipe = self.redis.pipeline(transaction=True)
            for key in streams:
                pipe.xrange(key, f"({after}", end, count=count)
            replies = await pipe.execute()
        parts = [[parse_entry(i, f) for i, f in rows] for rows in replies]
        return merge_partitions(parts, count)

    async def read_newest(
        self, before: StreamId | None, after: StreamId | None, count: int
    ) -> list[LogEntry]:
        """The newest entries older than `before` and newer than `after` (both exclusive,
        None: no bound), newest first."""
        streams = await self.streams()
        end = f"({before}" if before is not None else "+"
        start = f"({after}" if after is not None else "-"
        async with translate_redis_errors("read"):
            pipe = self.redis.pipeline(transaction=len(streams) > 1)
            for key in streams:
                pipe.xrevrange(key, end, start, count=count)
            replies = await pipe.execute()
        parts = [[parse_entry(i, f) for i, f in rows] for rows in replies]
        return parts[0] if len(parts) == 1 else merge_partitions(parts, count, newest_first=True)

    async def read_partitions(
        self, after: Mapping[int, StreamId], count: int
    ) -> tuple[dict[int, list[LogEntry]], StreamId]:
        """Up to `count` entries of each partition in `after` after its position, oldest first,
        and the bucket head at the same instant (one snapshot)."""
        n = await self.partition_count()
        async with translate_redis_errors("read"):
            pipe = self.redis.pipeline(transaction=True)
            for partition, position in after.items():
                pipe.xrange(self.keys.stream(partition, n), f"({position}", "+", count=count)
            pipe.get(self.keys.last)
            pipe.get(self.keys.trimmed)
            *replies, last, trimmed = await pipe.execute()
        entries = {
            partition: [parse_entry(i, f) for i, f in rows]
            for partition, rows in zip(after, replies, strict=True)
        }
        head = StreamId.parse(last or trimmed or b"0-0")
        return entries, head

    async def tail(self, after: StreamId, block_ms: int | None, count: int = 1000) -> LogRead:
        """Up to `count` entries per partition after `after`, with the checks of `LogRead`.

        With `block_ms` an `XREAD BLOCK` (COUNT 1) first waits up to that long for an entry after
        `after`, and TAIL_LUA is pipelined behind it: Redis runs the script as soon as the wait
        ends, so waiting, reading and checking cost one round trip. The blocking read only
        wakes; the entries come from the script (XREAD BLOCK cannot run in a script), atomic
        with the checks. Without `block_ms` it is the script alone.
        """
        n = await self.partition_count()
        keys = self.keys.common
        args: list[str | int] = [str(after), count, n]
        async with translate_redis_errors("tail"):
            if block_ms is None:
                reply = await self._tail(keys=keys, args=args)
            else:
                streams = [self.keys.stream(p, n) for p in range(n)]
                pipe = self.redis.pipeline(transaction=False)
                pipe.xread(dict.fromkeys(streams, str(after)), count=1, block=block_ms)
                pipe.evalsha(self._tail.sha, len(keys), *keys, *args)
                try:
                    _, reply = await pipe.execute()
                except redis.exceptions.NoScriptError:
                    # A restarted (or failed-over) Redis forgot the script: load it, read now.
                    reply = await self._tail(keys=keys, args=args)
        epoch, stored, head, trimmed, witnessed, length, added, *reads = reply
        parts = [[parse_entry(i, dict(zip(f[::2], f[1::2], strict=True))) for i, f in rows]
                 for rows in reads]
        if count == 0:
            entries: list[LogEntry] = []
        else:
            entries = parts[0] if n == 1 else merge_partitions(parts, count)
        return LogRead(
            entries,
            count > 0 and all(len(rows) < count for rows in reads),
            epoch.decode() or None,
            int(stored) if stored else None,
            StreamId.parse(head),
            StreamId.parse(trimmed),
            bool(witnessed),
            int(length),
            None if added < 0 else int(added),
        )

    async def renew_epoch(self, known: str) -> str:
        """Start a new epoch if the bucket's is still `known` (a rollback was seen); returns the
        bucket's epoch after it ('' when the bucket has none)."""
        async with translate_redis_errors("epoch"):
            epoch: Any = await self._renew_epoch(keys=self.keys.common, args=[known, new_epoch()])
        return str(epoch.decode())

    async def trim(self, max_age: float | None, max_items: int | None = None) -> int:
        """Remove items older than `max_age` seconds (Redis' clock) and the oldest beyond
        `max_items`, across every partition. Returns how many."""
        removed = 0
        while True:
            async with translate_redis_errors("trim"):
                count, more = await self._trim(
                    keys=self.keys.common,
                    args=[int((max_age or 0) * 1000), max_items or 0, TRIM_BATCH],
                )
            removed += int(count)
            if not more:
                return removed
            max_age = None

    # --- cursors stored for feed consumers -------------------------------------------------

    async def save_cursors(self, consumer: str, cursorset: str, cursors: Mapping[int, str]) -> None:
        if not cursors:
            return
        async with translate_redis_errors("cursorset"):
            await self.redis.hset(
                self.keys.cursorset(consumer),
                mapping={f"{cursorset}:{p}": cursor for p, cursor in cursors.items()},
            )

    async def load_cursors(
        self, consumer: str, cursorset: str, partitions: Sequence[int]
    ) -> dict[int, str | None]:
        async with translate_redis_errors("cursorset"):
            values: Any = await self.redis.hmget(
                self.keys.cursorset(consumer), [f"{cursorset}:{p}" for p in partitions]
            )
        return {p: v.decode() if v else None for p, v in zip(partitions, values, strict=True)}

    # --- reading the store ---------------------------------------------------------------

    async def page(self, resource: str, after_id: str | None, limit: int) -> Page:
        """Up to `limit` stored states of `resource` with ids after `after_id`, in id order."""
        start = "-" if after_id is None else "(" + after_id
        async with translate_redis_errors("page"):
            ids, states, head, epoch = await self._page(
                keys=[*self.keys.common, self.keys.index(resource), self.keys.state(resource)],
                args=[start, limit],
            )
        cursor = Cursor(epoch.decode(), StreamId.parse(head)) if epoch else None
        return Page([i.decode() for i in ids], list(states), cursor)

    async def get(self, resource: str, id: str) -> bytes | None:
        """The stored state of one resource object as JSON bytes, or None."""
        async with translate_redis_errors("get"):
            state: Any = await self.redis.hget(self.keys.state(resource), id)
        return state if state is None else bytes(state)

    async def aclose(self) -> None:
        await self.redis.aclose()


__all__ = ["Change", "ChangeBucket", "LogEntry", "LogRead", "Page", "Retention", "merge_partitions"]
