"""The commit path of one shard: commit.lua calls, one at a time or streamed.

A single commit runs on the connection single commits keep (`Channel`), packed as RESP once per
call; a stream of calls keeps up to a window of them in flight on one connection. A shard in a
Redis Cluster goes through redis-py's cluster client (it finds the master of the shard's slot),
one script call at a time. Every reply is remembered as the shard's witness: the newest position
this client was acknowledged, which the next commit sends so that a shard whose head is behind it
(Redis lost acknowledged commits) starts a new epoch.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
import structlog
from redis.asyncio.connection import AbstractConnection

from changefeed.cursor import StreamId, new_epoch
from publisher.bucket import scripts
from publisher.bucket.channel import Channel, Sent
from publisher.bucket.connection import EMPTY, KEEP_FOR_COMMITS, bulk, translate_redis_errors
from publisher.bucket.keys import Keys
from publisher.bucket.values import Committed, PackedChanges, unpack_bulk

log = structlog.get_logger(__name__)

_bulk = bulk

CommitCall = tuple[PackedChanges, str, str]
"""One commit.lua call: the packed changes, the idempotency key ('' for none) and the digest
of the changes ('' without a key)."""


@dataclass(slots=True)
class StreamStats:
    """What `ChangeBucket.commit_stream` did: batches sent, and seconds spent waiting for Redis
    (sending and reading replies; encoding the next batch overlaps the wait)."""

    batches: int = 0
    redis_seconds: float = 0.0


class Committer:
    """Runs commit.lua on one shard (keys `keys`, holding `partitions` partitions, '' when any
    count is accepted). `direct`: `client` talks to one server (a single Redis, Sentinel's
    master), so commits are packed and pipelined on connections of its pool; else it is a
    Redis Cluster client and each call goes through it. `epoch`: the epoch commit.lua gives
    the shard when it creates its keys (a shard of a bucket in a Redis Cluster gets the
    bucket's); None draws a new one as needed.
    """

    def __init__(
        self, client: aioredis.Redis, keys: Keys, name: str, partitions: int | None,
        idempotency_keys: int, *, direct: bool, what: str = "commit",
    ) -> None:
        self.redis = client
        self.keys = keys
        self.name = name
        self.direct = direct
        self.what = what
        self.partitions = partitions
        self.idempotency_keys = idempotency_keys
        self._script = client.register_script(scripts.COMMIT.text)
        self._witness: tuple[str, StreamId] | None = None
        """(epoch, position) of the newest change this client was acknowledged."""
        self._commits: Channel | None = None
        """The connection single commits keep (made at the first)."""
        self._evalsha = b"$7\r\nEVALSHA\r\n" + _bulk(scripts.COMMIT.sha.encode())
        self._load = b"*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n" + _bulk(scripts.COMMIT.text.encode())
        self._fixed_keys = b"".join(
            _bulk(key.encode()) for key in (*self.keys.common, *self.keys.idempotency_pair)
        )
        self._partitions_argument = _bulk(str(partitions or "").encode())
        self._most_argument = _bulk(str(idempotency_keys).encode())
        self._packed_keys: dict[str, bytes] = {}
        self._witness_packed = EMPTY
        """The witness argument, packed when the witness changes."""
        self.commit_one: Callable[[PackedChanges, str, str], Awaitable[Committed]] = (
            self._commit_direct if direct else self._commit_routed
        )
        """One commit.lua call of `packed` under `key` (digest: of the changes, '' without a
        key): bound once, so a single commit awaits no layer of its own."""
        self._adopted: str | None = None
        self._candidate = new_epoch()
        """The epoch commit.lua gives the shard if it creates it (or renews its epoch). Drawn
        again once a reply shows it became the epoch, or a commit's outcome is unknown, so no
        epoch is ever given twice; kept otherwise, as drawing one costs ten reads of
        /dev/urandom, a tenth of a single commit's time. A shard of a bucket in a Redis Cluster
        is given the bucket's (`adopt`) and keeps it."""

    def adopt(self, epoch: str) -> None:
        """The epoch this shard's keys get when a commit creates them: the bucket's."""
        self._adopted = self._candidate = epoch

    def _draw(self) -> None:
        self._candidate = self._adopted or new_epoch()

    def arguments(self, packed: PackedChanges, key: str | None) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of commit.lua for `packed` under idempotency `key`."""
        keys = [*self.keys.common, *self.keys.idempotency_pair]
        for resource in packed.resources:
            keys += [self.keys.state(resource), self.keys.index(resource)]
        args: list[Any] = [
            self._candidate,
            self.partitions or "",
            key or "",
            packed.digest() if key else "",
            self.idempotency_keys,
            self._witness_argument(),
            *unpack_bulk(packed.args),
        ]
        return keys, args

    @staticmethod
    def committed(reply: bytes) -> Committed:
        """commit.lua's reply '<epoch> <ms> <first seq> <count> <fresh> <renewed>' as a value."""
        epoch, ms, first, count, fresh, renewed = reply.split()
        return Committed(
            epoch.decode(), int(ms), int(first), int(count), fresh == b"1", renewed == b"1"
        )

    def _witness_argument(self) -> str:
        """commit.lua's witness: '<epoch> <ms>-<seq>' of the newest position acknowledged to
        this client, or '' before its first commit."""
        return "" if self._witness is None else f"{self._witness[0]} {self._witness[1]}"

    def _witnessed(self, committed: Committed) -> None:
        """Remember the newest position this client was acknowledged: the next commit sends it,
        and a bucket whose head is behind it (Redis lost acknowledged commits) gets a new epoch."""
        if committed.epoch == self._candidate:
            self._draw()
        if committed.renewed:
            log.error(
                "bucket rolled back: it lacks a commit this client had been acknowledged (its "
                "head was behind it, or it never held that commit's epoch); started a new epoch "
                "so that every listener bootstraps again",
                bucket=self.name, witness=None if self._witness is None else str(self._witness[1]),
                epoch=committed.epoch,
            )
        if not committed.fresh or not committed.count:
            return
        last = StreamId(committed.ms, committed.first + committed.count - 1)
        if self._witness is None or self._witness[0] != committed.epoch or self._witness[1] < last:
            self._witness = (committed.epoch, last)
            self._witness_packed = _bulk(self._witness_argument().encode())

    def _command(self, packed: PackedChanges, key: str, digest: str) -> bytes:
        """The whole EVALSHA of commit.lua for `packed`, as RESP: the fixed parts are packed
        once per bucket, the changes once per batch (`pack_changes`)."""
        resource_keys = [self._resource_keys(resource) for resource in packed.resources]
        count = 7 + 2 * len(resource_keys)
        return b"".join([
            b"*%d\r\n" % (3 + count + 6 + packed.arg_count),
            self._evalsha, _bulk(b"%d" % count), self._fixed_keys, *resource_keys,
            _bulk(self._candidate.encode()), self._partitions_argument,
            _bulk(key.encode()) if key else EMPTY, _bulk(digest.encode()) if digest else EMPTY,
            self._most_argument, self._witness_packed, packed.args,
        ])

    def _resource_keys(self, resource: str) -> bytes:
        """The state and index keys of `resource`, packed (once per resource)."""
        packed = self._packed_keys.get(resource)
        if packed is None:
            packed = self._packed_keys[resource] = _bulk(
                self.keys.state(resource).encode()
            ) + _bulk(self.keys.index(resource).encode())
        return packed

    def _answered(self, reply: bytes) -> Committed:
        """commit.lua's reply as a value, remembered as this client's witness."""
        committed = self.committed(reply)
        self._witnessed(committed)
        return committed

    async def _commit_direct(self, packed: PackedChanges, key: str, digest: str) -> Committed:
        """One commit.lua call, as `_commit_calls` runs it but without its stream: a single
        commit waits for its answer anyway, and the async generator and the queue of calls in
        flight cost a single commit as much as its own packing. On the connection single commits
        keep (`Channel`), or, while another commit is on it, on one from the pool."""
        command = self._command(packed, key, digest)
        channel = self._commits
        if channel is None:
            pool = self.redis.connection_pool
            if getattr(pool, "max_connections", 0) < KEEP_FOR_COMMITS:
                return await self._commit_pooled(command)
            channel = self._commits = Channel(pool, "commit")
        if channel.busy:
            return await self._commit_pooled(command)
        try:
            async with translate_redis_errors(self.what):  # failed before anything was sent
                (reply,) = await channel.exchange(command, 1, retry=False)
                if isinstance(reply, redis.exceptions.NoScriptError):  # it did not run
                    _, reply = await channel.exchange(self._load + command, 2, retry=False)
        except Sent as sent:
            self._draw()  # it may have become the epoch, unanswered
            async with translate_redis_errors(self.what, sent=True):
                assert sent.__cause__ is not None
                raise sent.__cause__ from None
        except asyncio.CancelledError:
            self._draw()
            raise
        if isinstance(reply, redis.exceptions.ReadOnlyError):  # not run: a demoted master
            async with translate_redis_errors(self.what):
                raise redis.exceptions.ConnectionError(f"Redis is now a replica ({reply})")
        if isinstance(reply, Exception):  # commit.lua refused (KEYREUSED...): nothing written
            async with translate_redis_errors(self.what, sent=True):
                raise reply
        return self._answered(reply)

    async def _commit_pooled(self, command: bytes) -> Committed:
        """`_commit_one`'s call on a connection of the pool."""
        pool = self.redis.connection_pool
        async with translate_redis_errors(self.what):
            connection: AbstractConnection = await pool.get_connection()  # type: ignore[no-untyped-call]
        answered = False
        try:
            async with translate_redis_errors(self.what, sent=True):
                await connection.send_packed_command(command, check_health=False)
                try:
                    try:
                        reply = await connection.read_response()
                    except redis.exceptions.NoScriptError:  # the call did not run: load, again
                        await connection.send_packed_command(
                            self._load + command, check_health=False
                        )
                        await connection.read_response()
                        reply = await connection.read_response()
                except redis.exceptions.ResponseError:
                    answered = True  # every reply was read: the connection is clean
                    raise
                answered = True
        finally:
            if not answered:
                self._draw()  # it may have become the epoch, unanswered
                await connection.disconnect()
            await pool.release(connection)
        return self._answered(reply)

    async def _commit_calls_direct(
        self,
        calls: Iterator[CommitCall],
        window: int,
        stats: StreamStats | None = None,
    ) -> AsyncIterator[Committed]:
        """Run commit.lua once per call of `calls`, in order, with up to `window` calls in flight
        on one connection, yielding each one's `Committed` in order: the next call is taken from
        `calls` (and packed) while Redis runs the ones sent before, so the writer's work and
        Redis's overlap. The one engine of every commit.

        When `calls` raises, the calls already sent are answered (and yielded) first, then the
        error is raised; a reply with an error is raised once every call sent before it is
        yielded. A call answered NOSCRIPT (Redis restarted or its scripts flushed) did not run:
        the script is loaded and the call sent again, pipelined, without waiting.
        """
        stats = stats if stats is not None else StreamStats()
        pool = self.redis.connection_pool
        async with translate_redis_errors(self.what):
            connection: AbstractConnection = await pool.get_connection()  # type: ignore[no-untyped-call]
        inflight: deque[bytes | None] = deque()
        """The commands sent and not answered yet, oldest first; None is a SCRIPT LOAD."""
        try:
            async with translate_redis_errors(self.what, sent=True):
                failure: BaseException | None = None
                error: redis.exceptions.ResponseError | None = None
                while True:
                    call = None
                    if failure is None and error is None:
                        try:
                            call = next(calls, None)
                        except Exception as exc:  # the caller's: answer what was sent first
                            failure = exc
                    if call is not None:
                        await self._send(connection, self._command(*call), inflight, stats)
                    while inflight and (len(inflight) > window or call is None):
                        committed, refused = await self._answer(connection, inflight, stats)
                        error = error or refused
                        if committed is not None:
                            yield committed
                    if call is None:
                        break
                if error is not None:
                    raise error
            if failure is not None:
                raise failure
        finally:
            if inflight:
                self._draw()  # it may have become the epoch, unanswered
                await connection.disconnect()
            await pool.release(connection)

    @staticmethod
    async def _send(
        connection: AbstractConnection, command: bytes, inflight: deque[bytes | None],
        stats: StreamStats,
    ) -> None:
        """Send one commit.lua call of a stream (`_commit_calls_direct`), not waiting for it."""
        started = time.perf_counter()
        await connection.send_packed_command(command, check_health=False)
        stats.redis_seconds += time.perf_counter() - started
        inflight.append(command)
        stats.batches += 1

    async def _answer(
        self, connection: AbstractConnection, inflight: deque[bytes | None], stats: StreamStats
    ) -> tuple[Committed | None, redis.exceptions.ResponseError | None]:
        """Read the reply to the oldest command in flight of a stream: (its `Committed`, None),
        (None, the error Redis answered), or (None, None) for a SCRIPT LOAD's or for a NOSCRIPT
        call, then sent again behind the script's load."""
        started = time.perf_counter()
        try:
            reply = await connection.read_response()
        except redis.exceptions.ResponseError as exc:
            reply = exc
        stats.redis_seconds += time.perf_counter() - started
        sent = inflight.popleft()
        if sent is None:  # a SCRIPT LOAD
            if isinstance(reply, redis.exceptions.ResponseError):
                return None, reply
        elif isinstance(reply, redis.exceptions.NoScriptError):
            await connection.send_packed_command(self._load + sent, check_health=False)
            inflight.extend((None, sent))
        elif isinstance(reply, redis.exceptions.ResponseError):
            return None, reply
        else:
            return self._answered(reply), None
        return None, None

    async def _commit_routed(self, packed: PackedChanges, key: str, digest: str = "") -> Committed:
        """One commit.lua call through a Redis Cluster client (to the master of the slot)."""
        keys, args = self.arguments(packed, key)
        async with translate_redis_errors(self.what, sent=True):
            reply = await self._script(keys=keys, args=args)
        return self._answered(reply)

    async def commit_calls(
        self, calls: Iterator[CommitCall], window: int, stats: StreamStats | None = None
    ) -> AsyncIterator[Committed]:
        """Run commit.lua once per call of `calls`, in order, yielding each one's `Committed`:
        up to `window` in flight on one connection (`_commit_calls_direct`), or one at a time
        through a Redis Cluster client."""
        stats = stats if stats is not None else StreamStats()
        if self.direct:
            async for committed in self._commit_calls_direct(calls, window, stats):
                yield committed
            return
        for packed, key, _ in calls:
            started = time.perf_counter()
            committed = await self._commit_routed(packed, key)
            stats.redis_seconds += time.perf_counter() - started
            stats.batches += 1
            yield committed

    async def drop(self) -> None:
        if self._commits is not None:
            await self._commits.drop()


__all__ = ["CommitCall", "Committer", "StreamStats"]
