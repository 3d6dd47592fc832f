"""The commit path of one shard: commit.lua calls, one at a time or streamed.

Every call is packed as RESP once. A single commit runs on the connection single commits keep
(`Channel`); a stream of calls keeps up to a window of them in flight on one connection of the
pool, and a single commit that finds the kept connection busy is a stream of one call. A shard in
a Redis Cluster differs only in routing: each call goes through redis-py's cluster client (it
finds the master of the shard's slot), one script call at a time.

Every acknowledged commit becomes a witness: its last change (position, partition, fingerprint),
which the client's next commits send until one of them, sent after that acknowledgement, is
acknowledged in turn: commit.lua has then looked for it in the Redis that ran it, and a Redis that
lacks it (it lost acknowledged commits: a rollback, a lagging replica promoted, the other side of
a split brain) starts a new epoch. One witness per socket is enough, as a Redis's history is a
prefix of its master's: the newest change acknowledged over a socket stands for every earlier one.
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
from publisher.bucket.lua import scripts
from publisher.bucket.redis.channel import Channel, Sent
from publisher.bucket.redis.connection import EMPTY, KEEP_FOR_COMMITS, bulk, translate_redis_errors
from publisher.bucket.values.changes import Committed, PackedChanges, unpack_bulk
from publisher.bucket.values.keys import Keys

log = structlog.get_logger(__name__)

_bulk = bulk

MOST_WITNESSES = 8
"""The most witnesses a commit sends (one per socket with acknowledgements not checked since):
concurrent commits over more connections than this leave the oldest unchecked."""

CommitCall = tuple[PackedChanges, str, str]
"""One commit.lua call: the packed changes, the idempotency key ('' for none) and the digest
of the changes ('' without a key)."""


@dataclass(slots=True)
class StreamStats:
    """What `ChangeBucket.commit_stream` did: batches sent, and seconds spent waiting for Redis
    (sending and reading replies; encoding the next batch overlaps the wait)."""

    batches: int = 0
    redis_seconds: float = 0.0

    def waited(self, seconds: float, batches: int = 0) -> None:
        """Count `seconds` waited for Redis, and `batches` sent."""
        self.redis_seconds += seconds
        self.batches += batches


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
        self._witnesses: dict[object, tuple[int, str]] = {}
        """Per socket (the routed path: per call), the number of its newest acknowledgement not
        checked since and that change's witness, '<id> <partition> <fingerprint>'."""
        self._acks = 0
        """Acknowledgements so far: a commit sent when there were n checks every witness
        numbered below n."""
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
        self._packed_witnesses: dict[object, bytes] = {}
        """The witnesses argument as packed, by the socket whose witness it leaves out (None:
        none left out); packed when first asked for, forgotten when the witnesses change."""
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
            packed.parts or "",
            *unpack_bulk(packed.args),
        ]
        return keys, args

    @staticmethod
    def _committed(parts: list[bytes]) -> Committed:
        """commit.lua's reply, split: the call's figures, and after its witness those of each
        transaction of a call of several (five each)."""
        epoch, ms, first, count, fresh, renewed = parts[:6]
        each = tuple(
            Committed(parts[at].decode(), int(parts[at + 1]), int(parts[at + 2]),
                      int(parts[at + 3]), parts[at + 4] == b"1")
            for at in range(8, len(parts), 5)
        )
        return Committed(
            epoch.decode(), int(ms), int(first), int(count), fresh == b"1", renewed == b"1", each
        )

    def _witness_argument(self, over: object = None) -> str:
        """commit.lua's witnesses: '<id> <partition> <fingerprint>' of each, space separated,
        or '' when there is none to check; without the one of socket `over`."""
        return " ".join(
            witness for socket, (_, witness) in self._witnesses.items() if socket is not over
        )

    def _witnesses_over(self, over: object) -> bytes:
        """The witnesses argument of a commit sent over socket `over`: that socket's own witness
        needs no check, as a socket leads to one Redis, whose own history holds what it
        acknowledged (one that lost it was restarted, which closed the socket, or demoted,
        which refuses the commit). Once a single connection is kept, the only witness is its
        own: a commit checks nothing, and costs Redis nothing more."""
        left_out = over if over in self._witnesses else None
        packed = self._packed_witnesses.get(left_out)
        if packed is None:
            argument = self._witness_argument(left_out)
            packed = self._packed_witnesses[left_out] = (
                _bulk(argument.encode()) if argument else EMPTY)
        return packed

    def _witnessed(
        self, committed: Committed, last_change: list[bytes], sent_after: int, source: object,
        over: object = None,
    ) -> None:
        """Take in an acknowledgement (`committed`, with its last change's partition and
        fingerprint, `last_change`; of a commit packed when `sent_after` others were
        acknowledged and without socket `over`'s witness, sent over `source`): the witnesses it
        carried are checked (`over`'s too when `source` is `over`), its last change is a witness
        for the next commits to carry."""
        if committed.epoch == self._candidate:
            self._draw()
        if committed.renewed:
            log.error(
                "bucket rolled back: it lacks a commit this client had been acknowledged; "
                "started a new epoch so that every listener bootstraps again",
                bucket=self.name, witnesses=self._witness_argument(), epoch=committed.epoch,
            )
        if not committed.fresh or not committed.count:
            return  # an idempotent replay checks nothing; an empty commit leaves no witness
        partition, fingerprint = last_change
        last = StreamId(committed.ms, committed.first + committed.count - 1)
        witnesses = {
            socket: (number, witness) for socket, (number, witness) in self._witnesses.items()
            if socket is not source and (number >= sent_after or socket is over)
        }
        witnesses[source] = (self._acks, f"{last} {partition.decode()} {fingerprint.decode()}")
        self._acks += 1
        while len(witnesses) > MOST_WITNESSES:
            del witnesses[min(witnesses, key=lambda socket: witnesses[socket][0])]
        self._witnesses = witnesses
        self._packed_witnesses = {}

    def _command(
        self, packed: PackedChanges, key: str, digest: str, over: object = None
    ) -> bytes:
        """The whole EVALSHA of commit.lua for `packed`, as RESP: the fixed parts are packed
        once per bucket, the changes once per batch (`pack_changes`)."""
        resource_keys = [self._resource_keys(resource) for resource in packed.resources]
        count = 7 + 2 * len(resource_keys)
        return b"".join([
            b"*%d\r\n" % (3 + count + 7 + packed.arg_count),
            self._evalsha, _bulk(b"%d" % count), self._fixed_keys, *resource_keys,
            _bulk(self._candidate.encode()), self._partitions_argument,
            _bulk(key.encode()) if key else EMPTY, _bulk(digest.encode()) if digest else EMPTY,
            self._most_argument, self._witnesses_over(over),
            _bulk(b"%d" % packed.parts) if packed.parts else EMPTY, packed.args,
        ])

    def _resource_keys(self, resource: str) -> bytes:
        """The state and index keys of `resource`, packed (once per resource)."""
        packed = self._packed_keys.get(resource)
        if packed is None:
            packed = self._packed_keys[resource] = _bulk(
                self.keys.state(resource).encode()
            ) + _bulk(self.keys.index(resource).encode())
        return packed

    def _answered(
        self, reply: bytes, sent_after: int, source: object, over: object = None
    ) -> Committed:
        """commit.lua's reply as a value, its witnesses taken in (`_witnessed`)."""
        parts = reply.split()
        committed = self._committed(parts)
        self._witnessed(committed, parts[6:8], sent_after, source, over)
        return committed

    async def _commit_direct(self, packed: PackedChanges, key: str, digest: str) -> Committed:
        """One commit.lua call, as `_commit_calls` runs it but without its stream: a single
        commit waits for its answer anyway, and the async generator and the queue of calls in
        flight cost a single commit as much as its own packing. On the connection single commits
        keep (`Channel`), or, while another commit is on it, on one from the pool."""
        sent_after = self._acks
        channel = self._commits
        if channel is None:
            pool = self.redis.connection_pool
            if getattr(pool, "max_connections", 0) < KEEP_FOR_COMMITS:
                return await self._commit_alone((packed, key, digest))
            channel = self._commits = Channel(pool, "commit")
        if channel.busy:
            return await self._commit_alone((packed, key, digest))
        over = channel.next_socket
        command = self._command(packed, key, digest, over)
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
        return self._answered(reply, sent_after, channel.socket, over)

    async def _commit_alone(self, call: CommitCall) -> Committed:
        """One commit.lua call on a connection of the pool: a stream of one call."""
        (committed,) = [c async for c in self._commit_calls_direct(iter([call]), 1)]
        return committed

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
        inflight: deque[tuple[bytes, int, object] | None] = deque()
        """The commands sent and not answered yet (each with the acknowledgements there were
        when it was packed, and the socket whose witness it left out), oldest first; None is a
        SCRIPT LOAD."""
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
                        over = connection._writer  # the stream's socket, unless it reconnects
                        command = self._command(*call, over)
                        await self._send(connection, (command, self._acks, over), inflight, stats)
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
        connection: AbstractConnection, command: tuple[bytes, int, object],
        inflight: deque[tuple[bytes, int, object] | None], stats: StreamStats,
    ) -> None:
        """Send one commit.lua call of a stream (`_commit_calls_direct`), not waiting for it.
        A connection closed with calls in flight (Sentinel's pool closes those to a master it
        left) is not opened again under them: redis-py would, and the next reply read would be
        another call's, from another Redis."""
        if inflight and not connection.is_connected:
            raise redis.exceptions.ConnectionError("the connection closed with commits in flight")
        started = time.perf_counter()
        await connection.send_packed_command(command[0], check_health=False)
        stats.redis_seconds += time.perf_counter() - started
        inflight.append(command)
        stats.batches += 1

    async def _answer(
        self, connection: AbstractConnection, inflight: deque[tuple[bytes, int, object] | None],
        stats: StreamStats,
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
            await connection.send_packed_command(self._load + sent[0], check_health=False)
            inflight.extend((None, sent))
        elif isinstance(reply, redis.exceptions.ResponseError):
            return None, reply
        else:
            return self._answered(reply, sent[1], connection._writer, sent[2]), None
        return None, None

    async def _commit_routed(self, packed: PackedChanges, key: str, digest: str = "") -> Committed:
        """One commit.lua call through a Redis Cluster client (to the master of the slot)."""
        keys, args = self.arguments(packed, key)
        sent_after = self._acks
        async with translate_redis_errors(self.what, sent=True):
            reply = await self._script(keys=keys, args=args)
        return self._answered(reply, sent_after, object())  # which connection: not known here

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
