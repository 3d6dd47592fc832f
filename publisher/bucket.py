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
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from publisher.cursor import Cursor, StreamId, new_epoch
from publisher.errors import BucketUnavailable, ChangeError, ChangefeedError
from publisher.protocol import ChangeItem, Resource

MAX_ID_BYTES = 512
BATCH = 500
"""Changes per Lua call in commit_many: keeps Redis responsive between calls."""

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
        self.epoch = f"{tag}:epoch"
        self.trimmed = f"{tag}:trimmed"
        self._tag = tag

    def state(self, resource: str) -> str:
        return f"{self._tag}:state:{resource}"

    def index(self, resource: str) -> str:
        return f"{self._tag}:index:{resource}"


# KEYS: log, epoch, then (state, index) per change.
# ARGV: candidate epoch, then (op, resource, sub-resources as JSON, id, state JSON) per change.
# Returns {epoch, id1, id2, ...}.
COMMIT_LUA = """
redis.call('SET', KEYS[2], ARGV[1], 'NX')
local out = {redis.call('GET', KEYS[2])}
local n = (#ARGV - 1) / 5
for j = 0, n - 1 do
  local a = 2 + j * 5
  local op, id = ARGV[a], ARGV[a + 3]
  local state_key, index_key = KEYS[3 + j * 2], KEYS[4 + j * 2]
  if op == 'put' then
    redis.call('HSET', state_key, id, ARGV[a + 4])
    redis.call('ZADD', index_key, 0, id)
  elseif op == 'delete' then
    redis.call('HDEL', state_key, id)
    redis.call('ZREM', index_key, id)
  end
  out[#out + 1] = redis.call('XADD', KEYS[1], '*', 'r', ARGV[a + 1], 's', ARGV[a + 2], 'i', id)
end
return out
"""

# KEYS: log, trimmed. ARGV: max age in ms. Trims entries older than max age by Redis' own clock
# and raises the trimmed horizon to the newest id removed. Returns the number removed.
TRIM_LUA = """
local t = redis.call('TIME')
local min_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(ARGV[1])
if min_ms <= 0 then return 0 end
local last = redis.call('XREVRANGE', KEYS[1], '(' .. min_ms .. '-0', '-', 'COUNT', 1)
if #last == 0 then return 0 end
local removed = redis.call('XTRIM', KEYS[1], 'MINID', min_ms .. '-0')
local newest = last[1][1]
local old = redis.call('GET', KEYS[2])
if old then
  local oms, oseq = string.match(old, '(%d+)-(%d+)')
  local nms, nseq = string.match(newest, '(%d+)-(%d+)')
  oms, oseq, nms, nseq = tonumber(oms), tonumber(oseq), tonumber(nms), tonumber(nseq)
  if oms > nms or (oms == nms and oseq >= nseq) then newest = old end
end
redis.call('SET', KEYS[2], newest)
return removed
"""

# KEYS: log, trimmed, epoch. Returns {epoch, trimmed, head id, oldest id}.
RETENTION_LUA = """
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local trimmed = redis.call('GET', KEYS[2]) or '0-0'
local head = trimmed
if #last > 0 then head = last[1][1] end
local oldest = ''
if #first > 0 then oldest = first[1][1] end
return {redis.call('GET', KEYS[3]) or '', trimmed, head, oldest}
"""

# KEYS: index, state, log, trimmed, epoch. ARGV: ZRANGEBYLEX start, limit.
# Returns {ids, states, head id, epoch}: one consistent snapshot.
PAGE_LUA = """
local ids = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[1], '+', 'LIMIT', 0, tonumber(ARGV[2]))
local states = {}
if #ids > 0 then states = redis.call('HMGET', KEYS[2], unpack(ids)) end
local last = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
local head = redis.call('GET', KEYS[4]) or '0-0'
if #last > 0 then head = last[1][1] end
return {ids, states, head, redis.call('GET', KEYS[5]) or ''}
"""


@asynccontextmanager
async def translate_redis_errors(what: str) -> AsyncIterator[None]:
    """The one place where redis-py's errors become ours."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        raise BucketUnavailable(f"{what}: Redis unreachable ({exc})", exc) from exc
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


class ChangeBucket:
    """Commits changes, reads the log and the store, and trims: one bucket in one Redis."""

    def __init__(
        self,
        client: aioredis.Redis,
        name: str,
        resources: Iterable[Resource] | None = None,
    ) -> None:
        self.redis = client
        self.keys = Keys(name)
        self.name = name
        self.resources = {r.resource: r for r in resources} if resources is not None else None
        self._commit = client.register_script(COMMIT_LUA)
        self._trim = client.register_script(TRIM_LUA)
        self._retention = client.register_script(RETENTION_LUA)
        self._page = client.register_script(PAGE_LUA)

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
        keys = [self.keys.log, self.keys.epoch]
        args: list[Any] = [new_epoch()]
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
    def cursors_of(reply: Sequence[bytes]) -> list[str]:
        """The cursors of COMMIT_LUA's reply {epoch, id...}."""
        epoch = reply[0].decode()
        return [Cursor(epoch, StreamId.parse(raw)).encode() for raw in reply[1:]]

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

    # --- reading the log -----------------------------------------------------------------

    async def ensure_epoch(self) -> str:
        """The bucket's epoch, creating the bucket's epoch if it has none yet."""
        async with translate_redis_errors("epoch"):
            await self.redis.set(self.keys.epoch, new_epoch(), nx=True)
            epoch = await self.redis.get(self.keys.epoch)
        return epoch.decode() if epoch else await self.ensure_epoch()

    async def current_epoch(self) -> str | None:
        """The bucket's epoch, or None when the bucket does not exist (yet, or any more)."""
        async with translate_redis_errors("epoch"):
            epoch = await self.redis.get(self.keys.epoch)
        return epoch.decode() if epoch else None

    async def retention(self) -> Retention:
        async with translate_redis_errors("retention"):
            epoch, trimmed, head, oldest = await self._retention(
                keys=[self.keys.log, self.keys.trimmed, self.keys.epoch]
            )
        return Retention(
            epoch.decode() or None,
            StreamId.parse(trimmed),
            StreamId.parse(head),
            StreamId.parse(oldest) if oldest else None,
        )

    async def read(
        self, after: StreamId, until: StreamId | None = None, count: int = 1000
    ) -> list[LogEntry]:
        """Entries after `after` (exclusive) up to `until` (inclusive), oldest first."""
        async with translate_redis_errors("read"):
            rows = await self.redis.xrange(
                self.keys.log, f"({after}", str(until) if until else "+", count=count
            )
        return [parse_entry(entry_id, fields) for entry_id, fields in rows]

    async def tail(self, after: StreamId, block_ms: int, count: int = 1000) -> list[LogEntry]:
        """Entries after `after`, waiting up to `block_ms` for the first (XREAD BLOCK)."""
        async with translate_redis_errors("tail"):
            reply = await self.redis.xread({self.keys.log: str(after)}, count=count, block=block_ms)
        if not reply:
            return []
        return [parse_entry(entry_id, fields) for entry_id, fields in reply[0][1]]

    async def trim(self, max_age: float) -> int:
        """Remove items older than `max_age` seconds (Redis' clock). Returns how many."""
        async with translate_redis_errors("trim"):
            removed = await self._trim(
                keys=[self.keys.log, self.keys.trimmed], args=[int(max_age * 1000)]
            )
        return int(removed)

    # --- reading the store ---------------------------------------------------------------

    async def page(self, resource: str, after_id: str | None, limit: int) -> Page:
        """Up to `limit` stored states of `resource` with ids after `after_id`, in id order."""
        start = "-" if after_id is None else "(" + after_id
        async with translate_redis_errors("page"):
            ids, states, head, epoch = await self._page(
                keys=[
                    self.keys.index(resource),
                    self.keys.state(resource),
                    self.keys.log,
                    self.keys.trimmed,
                    self.keys.epoch,
                ],
                args=[start, limit],
            )
        cursor = Cursor(epoch.decode(), StreamId.parse(head)) if epoch else None
        return Page([i.decode() for i in ids], list(states), cursor)

    async def get(self, resource: str, id: str) -> bytes | None:
        """The stored state of one resource object as JSON bytes, or None."""
        async with translate_redis_errors("get"):
            state: bytes | None = await self.redis.hget(self.keys.state(resource), id)
        return state

    async def aclose(self) -> None:
        await self.redis.aclose()


__all__ = ["Change", "ChangeBucket", "LogEntry", "Page", "Retention"]
