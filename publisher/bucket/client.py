"""`ChangeBucket`: the change bucket and the authoritative store, in one Redis.

`commit` writes the state and appends the item in one Lua script, so the store and the bucket
never disagree. `trim` removes items older than maxAge and records the horizon; it is idempotent,
so every publisher on a bucket may run it. The key layout is in `keys.py`, the scripts in the
`.lua` files beside this module.

Errors of redis-py are translated into ours here (`translate_redis_errors`) and nowhere else. A
commit tells two failures apart: `BucketUnavailable` when no connection could be had, so nothing
was sent; `CommitOutcomeUnknown` when the script was sent and no answer came, so it may have run.
That is why commits take a connection from the pool themselves before sending anything (or use
the one single commits keep, `publisher.bucket.channel`, replaced before sending when Redis
closed it).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, cast

import redis.asyncio as aioredis
import redis.exceptions
import structlog
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from changefeed.cursor import Cursor, StreamId, new_epoch
from changefeed.errors import (
    BucketBusy,
    BucketUnavailable,
    ChangeError,
    ChangefeedError,
    CommitOutcomeUnknown,
    PartitionMismatch,
    ReplicationTimeout,
)
from changefeed.protocol import Resource
from publisher.bucket import scripts
from publisher.bucket.channel import Channel, Sent
from publisher.bucket.cluster_client import connect_cluster
from publisher.bucket.cluster_url import is_cluster_url
from publisher.bucket.keys import Keys
from publisher.bucket.sentinel import is_sentinel_url, sentinel_pool
from publisher.bucket.values import (
    MAX_ID_BYTES,
    Change,
    Committed,
    Encoded,
    LogEntry,
    LogRead,
    PackedChanges,
    Piece,
    Retention,
    StatePage,
    encode_change,
    merge_partitions,
    pack_changes,
    parse_entry,
    unpack_bulk,
)

log = structlog.get_logger(__name__)

BATCH = 500
"""Changes per Lua call in commit_many: keeps Redis responsive between calls."""
TRIM_BATCH = 10000
"""Most items (and idempotency keys) one trim call removes (the rest go in the next call)."""
REPLICAS_TIMEOUT = 2.0
"""Seconds `commit(..., replicas=N)` waits for the replicas by default."""
IDEMPOTENCY_KEYS = 100_000
"""Most idempotency keys a bucket remembers; past it the oldest are forgotten first."""

Batch = tuple[Sequence[Change], str | None]
"""Changes committed atomically by one script call, and the call's idempotency key (or None)."""
KeyOf = Callable[[str], str | None]
"""The idempotency key of an encoded batch, given the digest of its changes (or None: no key)."""
EncodedBatch = tuple[Sequence[Encoded], KeyOf]
"""Encoded changes committed atomically by one script call, and how to name the call's key."""
CommitCall = tuple[PackedChanges, str, str]
"""One commit.lua call: the packed changes, the idempotency key ('' for none) and the digest
of the changes ('' without a key)."""
KINDS_REMEMBERED = 4096
"""(resource, sub-resources) pairs a bucket remembers as valid (`ChangeBucket.validate`)."""
WINDOW = 4
"""Script calls commit_many and commit_batches keep in flight on their connection: Redis runs
one while the writer packs the next and reads the answers before it, so neither waits for the
other."""


@dataclass(slots=True)
class StreamStats:
    """What `ChangeBucket.commit_stream` did: batches sent, and seconds spent waiting for Redis
    (sending and reading replies; encoding the next batch overlaps the wait)."""

    batches: int = 0
    redis_seconds: float = 0.0


def _partitions_error(what: str, message: str) -> ChangefeedError:
    return PartitionMismatch(
        f"bucket.partitions: {message} (the partition count is fixed when the bucket is created)"
    )


def _key_reused_error(what: str, message: str) -> ChangefeedError:
    count, _, key = message.partition(" ")
    return ChangeError(
        f"{what}: idempotency key {key!r} was first used for other changes ({count} of them); "
        "a key names one commit, retried with the same changes"
    )


POOL_SIZE = 64
"""Connections a client's pool holds at most (config.js `bucket.poolSize`)."""
POOL_TIMEOUT = 5.0
"""Seconds a caller waits for a pooled connection before `BucketBusy` (`bucket.poolTimeout`)."""
KEEP_FOR_COMMITS = 4
"""Pools of at least this many connections keep one for single commits (`Channel`); a smaller
pool lends its connections one call at a time to everything, single commits included."""
_POOL_EXHAUSTED = "No connection available."
"""redis-py's message when no connection of a BlockingConnectionPool came free in time."""

_SCRIPT_ERRORS = {"PARTITIONS ": _partitions_error, "KEYREUSED ": _key_reused_error}
"""Errors our scripts reply with, by prefix: the error of ours each one becomes."""


_CLUSTER_REFUSALS = (
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.RedisClusterException,
)


class _Translated:
    """`translate_redis_errors`' context: a class rather than a generator-based context manager,
    as every commit enters two and a single commit is a few hundred microseconds."""

    __slots__ = ("sent", "what")

    def __init__(self, what: str, sent: bool) -> None:
        self.what = what
        self.sent = sent

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        what = self.what
        if exc is None:
            return
        if isinstance(
            exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
        ):
            if isinstance(exc.__cause__, TimeoutError) and str(exc) == _POOL_EXHAUSTED:
                # Raised while waiting for a pooled connection: nothing was sent.
                raise BucketBusy(
                    f"{what}: every Redis connection of the pool was busy", exc
                ) from exc
            if self.sent:
                raise CommitOutcomeUnknown(
                    f"{what}: no answer from Redis ({exc}); the commit may have been written", exc
                ) from exc
            raise BucketUnavailable(f"{what}: Redis unreachable ({exc})", exc) from exc
        if isinstance(exc, _CLUSTER_REFUSALS):
            # A Redis Cluster refused before running anything (down, a slot not served, no
            # node reachable): nothing was written.
            raise BucketUnavailable(f"{what}: Redis Cluster unavailable ({exc})", exc) from exc
        if isinstance(exc, redis.exceptions.ResponseError):
            for prefix, error in _SCRIPT_ERRORS.items():
                if str(exc).startswith(prefix):
                    raise error(what, str(exc).removeprefix(prefix)) from None
            raise ChangefeedError(f"{what}: Redis error ({exc})") from exc
        if isinstance(exc, redis.exceptions.RedisError):
            raise ChangefeedError(f"{what}: Redis error ({exc})") from exc


def translate_redis_errors(what: str, *, sent: bool = False) -> AbstractAsyncContextManager[None]:
    """The one place where redis-py's errors become ours.

    `sent`: the block has sent (or may have sent) a commit when it fails to hear the answer, so
    a lost connection or a timeout means the commit may have been written (CommitOutcomeUnknown),
    not that nothing was (BucketUnavailable).
    """
    return _Translated(what, sent)


def connect(
    url: str,
    *,
    blocking: bool = False,
    timeout: float | None = None,
    pool_size: int = POOL_SIZE,
    pool_timeout: float = POOL_TIMEOUT,
) -> aioredis.Redis:
    """A redis-py client for `url` that never sends a commit twice (a commit without an
    idempotency key is not idempotent).

    Its pool holds at most `pool_size` connections; a caller that finds them all busy waits up to
    `pool_timeout` seconds for one, then gets `BucketBusy` (overload, not an outage).
    `blocking` clients wait longer for a reply, for XREAD BLOCK (which waits at most 5 s);
    `timeout` overrides how long any reply is waited for (seconds).

    A `redis+sentinel://` URL (`publisher.bucket.sentinel`) gives a client of the master the
    sentinels name, with the same pool: each new connection asks the sentinels, so the client
    follows a failover.

    A `redis+cluster://` URL gives redis-py's `RedisCluster` (`connect_cluster`), and a
    `ChangeBucket` made with it is a `ClusterBucket` (`publisher.bucket.cluster`): the usual
    `ChangeBucket(connect(url), name, resources)` works for any URL.
    """
    if is_cluster_url(url):
        cluster: Any = connect_cluster(url, blocking=blocking, timeout=timeout,
                                       pool_size=pool_size)
        return cast(aioredis.Redis, cluster)
    options: dict[str, Any] = dict(
        max_connections=pool_size,
        timeout=pool_timeout,
        # One retry, on a fresh connection, when a pooled connection turns out dead (Redis
        # restarted since it was last used): every command redis-py sends for us is a read or an
        # idempotent write. Commits bypass this (commit_batches sends them itself), and so never
        # run twice; timeouts are not retried either.
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)),
        socket_connect_timeout=5,
        socket_timeout=timeout or (20 if blocking else 10),
        health_check_interval=0,
    )
    pool: aioredis.ConnectionPool
    if is_sentinel_url(url):
        pool = sentinel_pool(url, **options)
    else:
        pool = aioredis.BlockingConnectionPool.from_url(url, **options)
    return aioredis.Redis.from_pool(pool)


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


_EMPTY = _bulk(b"")


def _log_read(reply: Any, count: int, n: int) -> LogRead:
    """tail.lua's reply as a `LogRead`."""
    epoch, stored, head, trimmed, witnessed, length, added, *reads = reply
    if count == 0:
        entries: list[LogEntry] = []
    elif n == 1:
        entries = [parse_entry(i, dict(zip(f[::2], f[1::2], strict=True))) for i, f in reads[0]]
    else:
        parts = [[parse_entry(i, dict(zip(f[::2], f[1::2], strict=True))) for i, f in rows]
                 for rows in reads]
        entries = merge_partitions(parts, count)
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


class ChangeBucket:
    """Commits changes, reads the log and the store, and trims: one bucket in one Redis.

    `partitions` is the partition count the bucket must have (the configured one); None accepts
    whatever the bucket was created with (1 for a new bucket). `idempotency_keys` bounds how many
    idempotency keys the bucket remembers.

    >>> bucket = ChangeBucket(connect("redis://127.0.0.1:6379/0"), "changefeed", resources)
    >>> cursor = await bucket.commit("vm", vm_uuid, ["nic"], state, key=request_id)
    """

    cluster_class: type[ChangeBucket] | None = None
    """`publisher.bucket.cluster.ClusterBucket`, set when that module is imported (by the
    package, `publisher.bucket`): what a `ChangeBucket` over a Redis Cluster client is."""

    def __new__(cls, client: aioredis.Redis, *args: Any, **kwargs: Any) -> ChangeBucket:
        """A `ClusterBucket` when `client` is a Redis Cluster client (`connect` of a
        `redis+cluster://` URL)."""
        if cls is ChangeBucket and isinstance(client, RedisCluster):
            if ChangeBucket.cluster_class is None:
                raise ChangefeedError("a Redis Cluster client needs publisher.bucket.cluster")
            return super().__new__(ChangeBucket.cluster_class)
        return super().__new__(cls)

    def __init__(
        self,
        client: aioredis.Redis,
        name: str,
        resources: Iterable[Resource] | None = None,
        partitions: int | None = None,
        *,
        idempotency_keys: int = IDEMPOTENCY_KEYS,
    ) -> None:
        self.redis = client
        self._witness: tuple[str, StreamId] | None = None
        """(epoch, position) of the newest change this client was acknowledged."""
        """The redis-py client: the bucket's own. Other modules use the methods."""
        self.keys = Keys(name)
        self.name = name
        self.resources = {r.resource: r for r in resources} if resources is not None else None
        self.partitions = partitions
        self.idempotency_keys = idempotency_keys
        self._known_partitions: int | None = None
        self._ensure = client.register_script(scripts.ENSURE.text)
        self._trim = client.register_script(scripts.TRIM.text)
        self._retention = client.register_script(scripts.RETENTION.text)
        self._page = client.register_script(scripts.PAGE.text)
        self._save_cursors = client.register_script(scripts.SAVE_CURSORS.text)
        self._tail = client.register_script(scripts.TAIL.text)
        self._tail_packed: dict[tuple[int, int, int], tuple[bytes, bytes, bytes]] = {}
        self._channel: Channel | None = None
        """The connection the blocking tail reads keep (made at the first)."""
        self._reads_abandoned = False
        self._commits: Channel | None = None
        """The connection single commits keep (made at the first)."""
        self._renew_epoch = client.register_script(scripts.RENEW_EPOCH.text)
        self._evalsha = b"$7\r\nEVALSHA\r\n" + _bulk(scripts.COMMIT.sha.encode())
        self._load = b"*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n" + _bulk(scripts.COMMIT.text.encode())
        self._fixed_keys = b"".join(
            _bulk(key.encode()) for key in (*self.keys.common, *self.keys.idempotency_pair)
        )
        self._partitions_argument = _bulk(str(partitions or "").encode())
        self._most_argument = _bulk(str(idempotency_keys).encode())
        self._packed_keys: dict[str, bytes] = {}
        self._fitting: set[tuple[str, tuple[str, ...]]] = set()
        """(resource, sub-resources) pairs that `validate` found fitting."""
        self._witness_packed = _EMPTY
        """The witness argument, packed when the witness changes."""
        self._candidate = new_epoch()
        """The epoch commit.lua gives the bucket if it creates it (or renews its epoch). Drawn
        again once a reply shows it became the epoch, or a commit's outcome is unknown, so no
        epoch is ever given twice; kept otherwise, as drawing one costs ten reads of
        /dev/urandom, a tenth of a single commit's time."""

    # --- writing -------------------------------------------------------------------------

    def validate(self, change: Change) -> None:
        """Raise ChangeError if `change` does not fit the configured resources.

        A (resource, sub-resources) pair that fitted once is remembered (up to KINDS_REMEMBERED
        of them), so a writer of many changes checks each kind once, and each change's id."""
        id = change.changed_resource_id
        if not isinstance(id, str) or not id:
            raise ChangeError("changedResourceId must be a non-empty string")
        if len(id) * 4 > MAX_ID_BYTES and len(id.encode()) > MAX_ID_BYTES:
            raise ChangeError(f"changedResourceId longer than {MAX_ID_BYTES} bytes")
        kind = (change.resource, change.sub_resources)
        hashable = type(change.sub_resources) is tuple
        try:
            if hashable and kind in self._fitting:
                return
        except TypeError:  # a sub-resource that is not even hashable: refused below
            hashable = False
        if not change.sub_resources or not all(isinstance(s, str) for s in change.sub_resources):
            raise ChangeError("a change needs at least one sub-resource name")
        if self.resources is not None:
            resource = self.resources.get(change.resource)
            if resource is None:
                known = ", ".join(sorted(self.resources))
                raise ChangeError(f"unknown resource {change.resource!r} (known: {known})")
            unknown = [s for s in change.sub_resources if s not in resource.sub_resources]
            if unknown:
                raise ChangeError(
                    f"unknown sub-resource(s) {', '.join(map(repr, unknown))} of "
                    f"{change.resource!r} (known: {', '.join(resource.sub_resources)})"
                )
        if hashable and len(self._fitting) < KINDS_REMEMBERED:
            self._fitting.add(kind)

    def commit_arguments(
        self, changes: Sequence[Change], key: str | None = None
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of commit.lua for `changes` (validated), under idempotency `key`: for a
        client that passes them one by one (commits go through `commit_many`, packed)."""
        packed = self._pack(changes)
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

    @classmethod
    def cursors_of(cls, reply: bytes) -> list[str]:
        """The cursors of commit.lua's reply."""
        return cls.committed(reply).cursors

    def _pack(self, changes: Sequence[Change]) -> PackedChanges:
        """`changes` validated and packed for one commit.lua call (ChangeError: one does not fit;
        orjson's error: a state is not JSON)."""
        for change in changes:
            self.validate(change)
        return pack_changes([encode_change(change) for change in changes])

    async def commit_batches(self, batches: Sequence[Batch]) -> list[Committed]:
        """Commit each batch atomically (one script call each, up to WINDOW in flight), in
        order; a batch whose key is already known is not written again (`fresh` False).

        Every change is validated before anything is sent. Raises BucketUnavailable when nothing
        was sent, CommitOutcomeUnknown when the calls were sent but no answer came: some or all
        of them may be in the bucket (send them again with the same keys to find out).
        """
        calls = [
            (packed, key or "", packed.digest() if key else "")
            for packed, key in ((self._pack(changes), key) for changes, key in batches)
        ]
        if len(calls) == 1:
            return [await self._commit_one(*calls[0])]
        return [committed async for committed in self._commit_calls(iter(calls), WINDOW)]

    def _witness_argument(self) -> str:
        """commit.lua's witness: '<epoch> <ms>-<seq>' of the newest position acknowledged to
        this client, or '' before its first commit."""
        return "" if self._witness is None else f"{self._witness[0]} {self._witness[1]}"

    def _witnessed(self, committed: Committed) -> None:
        """Remember the newest position this client was acknowledged: the next commit sends it,
        and a bucket whose head is behind it (Redis lost acknowledged commits) gets a new epoch."""
        if committed.epoch == self._candidate:
            self._candidate = new_epoch()
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
            _bulk(key.encode()) if key else _EMPTY, _bulk(digest.encode()) if digest else _EMPTY,
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

    async def _commit_one(self, packed: PackedChanges, key: str, digest: str) -> Committed:
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
            async with translate_redis_errors("commit"):  # failed before anything was sent
                (reply,) = await channel.exchange(command, 1, retry=False)
                if isinstance(reply, redis.exceptions.NoScriptError):  # it did not run
                    _, reply = await channel.exchange(self._load + command, 2, retry=False)
        except Sent as sent:
            self._candidate = new_epoch()  # it may have become the epoch, unanswered
            async with translate_redis_errors("commit", sent=True):
                assert sent.__cause__ is not None
                raise sent.__cause__ from None
        except asyncio.CancelledError:
            self._candidate = new_epoch()
            raise
        if isinstance(reply, redis.exceptions.ReadOnlyError):  # not run: a demoted master
            async with translate_redis_errors("commit"):
                raise redis.exceptions.ConnectionError(f"Redis is now a replica ({reply})")
        if isinstance(reply, Exception):  # commit.lua refused (KEYREUSED...): nothing written
            async with translate_redis_errors("commit", sent=True):
                raise reply
        return self._answered(reply)

    async def _commit_pooled(self, command: bytes) -> Committed:
        """`_commit_one`'s call on a connection of the pool."""
        pool = self.redis.connection_pool
        async with translate_redis_errors("commit"):
            connection: AbstractConnection = await pool.get_connection()  # type: ignore[no-untyped-call]
        answered = False
        try:
            async with translate_redis_errors("commit", sent=True):
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
                self._candidate = new_epoch()  # it may have become the epoch, unanswered
                await connection.disconnect()
            await pool.release(connection)
        return self._answered(reply)

    async def _commit_calls(
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
        async with translate_redis_errors("commit"):
            connection: AbstractConnection = await pool.get_connection()  # type: ignore[no-untyped-call]
        inflight: deque[bytes | None] = deque()
        """The commands sent and not answered yet, oldest first; None is a SCRIPT LOAD."""
        try:
            async with translate_redis_errors("commit", sent=True):
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
                        command = self._command(*call)
                        started = time.perf_counter()
                        await connection.send_packed_command(command, check_health=False)
                        stats.redis_seconds += time.perf_counter() - started
                        inflight.append(command)
                        stats.batches += 1
                    while inflight and (len(inflight) > window or call is None):
                        started = time.perf_counter()
                        try:
                            reply = await connection.read_response()
                        except redis.exceptions.ResponseError as exc:
                            reply = exc
                        stats.redis_seconds += time.perf_counter() - started
                        sent = inflight.popleft()
                        if sent is None:  # a SCRIPT LOAD
                            if isinstance(reply, redis.exceptions.ResponseError):
                                error = error or reply
                        elif isinstance(reply, redis.exceptions.NoScriptError):
                            await connection.send_packed_command(
                                self._load + sent, check_health=False
                            )
                            inflight.extend((None, sent))
                        elif isinstance(reply, redis.exceptions.ResponseError):
                            error = error or reply
                        else:
                            yield self._answered(reply)
                    if call is None:
                        break
                if error is not None:
                    raise error
            if failure is not None:
                raise failure
        finally:
            if inflight:
                self._candidate = new_epoch()  # it may have become the epoch, unanswered
                await connection.disconnect()
            await pool.release(connection)

    async def commit_stream(
        self, batches: Iterator[EncodedBatch], window: int, stats: StreamStats | None = None
    ) -> AsyncIterator[Committed]:
        """Commit encoded batches as `commit_batches` does, yielding each one's `Committed` in
        order, with up to `window` script calls in flight: the next batch is taken from
        `batches` (and encoded by it) while Redis runs the ones sent before.

        The key of a batch is `key_of(digest)`, the digest being that of its encoded changes.
        The changes are not validated here: the caller built them checked. When `batches` raises,
        the calls already sent are answered (and yielded) first, then the error is raised; a
        reply with an error is raised once every call sent before it is yielded.
        """

        def calls() -> Iterator[CommitCall]:
            for changes, key_of in batches:
                packed = pack_changes(changes)
                digest = packed.digest()
                key = key_of(digest) or ""
                yield packed, key, digest if key else ""

        async for committed in self._commit_calls(calls(), window, stats):
            yield committed

    async def commit_many(self, changes: Iterable[Change], *, key: str | None = None) -> list[str]:
        """Commit changes atomically per batch of BATCH, in order; returns their cursors.

        Every change is validated before anything is sent; each batch is then encoded while
        Redis runs the ones before it (up to WINDOW in flight), so a state that orjson cannot
        encode fails its batch, after the batches before it are in. With an idempotency `key`,
        batch n of the call is committed under `key` (n = 0) or `key#n`: a call retried with the
        same key and the same changes writes only the batches that did not get in, and returns
        every change's original cursor.

        >>> cursors = await bucket.commit_many([Change.put("vm", id, ["nic"], state)], key=k)
        """
        changes = list(changes)
        for change in changes:
            self.validate(change)
        if len(changes) <= BATCH:
            if not changes:
                return []
            packed = pack_changes([encode_change(change) for change in changes])
            done = await self._commit_one(packed, key or "", packed.digest() if key else "")
            return done.cursors

        def calls() -> Iterator[CommitCall]:
            for number, start in enumerate(range(0, len(changes), BATCH)):
                packed = pack_changes([encode_change(c) for c in changes[start : start + BATCH]])
                if key is None:
                    yield packed, "", ""
                else:
                    yield packed, key if number == 0 else f"{key}#{number}", packed.digest()

        cursors: list[str] = []
        async for committed in self._commit_calls(calls(), WINDOW):
            cursors += committed.cursors
        return cursors

    async def commit(
        self,
        resource: str,
        id: str,
        sub_resources: Sequence[str],
        state: Any = None,
        *,
        delete: bool = False,
        key: str | None = None,
        replicas: int = 0,
        replicas_timeout: float = REPLICAS_TIMEOUT,
    ) -> str:
        """Store `state` (or delete it) and append the change item atomically; return its cursor.

        A commit retried with the same idempotency `key` returns the first one's cursor and
        writes nothing. With `replicas`, it returns only once that many replicas have the commit
        (Redis WAIT), else raises ReplicationTimeout after `replicas_timeout` seconds (the
        commit is written on the master all the same).

        >>> cursor = await bucket.commit("vm", vm_uuid, ["nic"], {"uuid": vm_uuid}, key=request_id)
        """
        change = (
            Change.delete(resource, id, sub_resources)
            if delete
            else Change.put(resource, id, sub_resources, state)
        )
        cursors = await self.commit_replicated(
            [change], key=key, replicas=replicas, timeout=replicas_timeout
        )
        return cursors[0]

    async def commit_replicated(
        self,
        changes: Iterable[Change],
        *,
        key: str | None = None,
        replicas: int = 0,
        timeout: float = REPLICAS_TIMEOUT,
    ) -> list[str]:
        """`commit_many`, then wait until `replicas` replicas have the changes (none: no wait).

        Raises ReplicationTimeout (with the cursors) when fewer replicas confirmed them within
        `timeout` seconds: they are written on the master, and lost if it fails before a
        replica has them.

        >>> cursors = await bucket.commit_replicated(changes, key=k, replicas=1)
        """
        cursors = await self.commit_many(changes, key=key)
        if replicas > 0:
            try:
                acknowledged = await self.wait_for_replicas(replicas, timeout)
            except BucketUnavailable as exc:
                raise ReplicationTimeout(
                    f"commit: written on the master, but whether {replicas} replica(s) have "
                    f"it is unknown: {exc}", cursors, replicas, 0,
                ) from exc
            if acknowledged < replicas:
                raise ReplicationTimeout(
                    f"commit: written on the master, but only {acknowledged} of {replicas} "
                    f"replica(s) confirmed it within {timeout:g} s",
                    cursors, replicas, acknowledged,
                )
        return cursors

    async def wait_for_replicas(self, replicas: int, timeout: float) -> int:
        """Wait up to `timeout` seconds until `replicas` replicas have every write the master
        acknowledged before this call; returns how many had them (Redis WAIT).

        WAIT counts the replicas that have the writes *of its own connection*. So this writes a
        marker on the connection it waits on: the replication stream is in order, and a replica
        that has the marker has every commit acknowledged before it was written, whichever
        pooled connection sent those. One round trip, and the commit path is untouched.
        """
        async with translate_redis_errors("wait for replicas"):
            pipe = self.redis.pipeline(transaction=False)
            pipe.set(self.keys.replicated, str(time.time()), px=60_000)
            pipe.execute_command("WAIT", replicas, max(1, int(timeout * 1000)))
            _, acknowledged = await pipe.execute()
        return int(acknowledged)

    async def publish(
        self, resource: str, id: str, sub_resources: Sequence[str], *, key: str | None = None
    ) -> str:
        """Append a change item only (the service's store lives elsewhere). Returns the cursor."""
        return (await self.commit_many([Change.publish(resource, id, sub_resources)], key=key))[0]

    async def publish_many(
        self, changes: Iterable[tuple[str, str, Sequence[str]]], *, key: str | None = None
    ) -> list[str]:
        return await self.commit_many((Change.publish(r, i, s) for r, i, s in changes), key=key)

    # --- the bucket's identity -----------------------------------------------------------

    async def ping(self, what: str = "ping") -> None:
        """Raise BucketUnavailable (saying `what` was tried) unless Redis answers."""
        async with translate_redis_errors(what):
            await self.redis.ping()

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
        `after`, and the tail script is pipelined behind it: Redis runs the script as soon as the
        wait ends, so waiting, reading and checking cost one round trip. The blocking read only
        wakes; the entries come from the script (XREAD BLOCK cannot run in a script), atomic
        with the checks. Without `block_ms` it is the script alone.
        """
        n = await self.partition_count()
        keys = self.keys.common
        args: list[str | int] = [str(after), count, n]
        async with translate_redis_errors("tail"):
            reply = None
            if block_ms is not None:
                reply = await self._wait_and_tail(self._tail_command(after, block_ms, count, n))
            if reply is None:
                # No wait, or a restarted (or failed-over) Redis forgot the script: load it
                # (redis-py's Script does), read now.
                reply = await self._tail(keys=keys, args=args)
        return _log_read(reply, count, n)

    def _tail_command(self, after: StreamId, block_ms: int, count: int, n: int) -> bytes:
        """XREAD BLOCK then EVALSHA of tail.lua, packed as RESP: everything but the position is
        packed once per (block, count, partitions)."""
        shape = (block_ms, count, n)
        parts = self._tail_packed.get(shape)
        if parts is None:
            streams = [_bulk(self.keys.stream(p, n).encode()) for p in range(n)]
            keys = self.keys.common
            parts = self._tail_packed[shape] = (
                b"*%d\r\n" % (6 + 2 * n) + b"".join(
                    _bulk(word) for word in (b"XREAD", b"COUNT", b"1", b"BLOCK", b"%d" % block_ms,
                                             b"STREAMS")) + b"".join(streams),
                b"*%d\r\n" % (3 + len(keys) + 3) + _bulk(b"EVALSHA")
                + _bulk(self._tail.sha.encode()) + _bulk(b"%d" % len(keys))
                + b"".join(_bulk(key.encode()) for key in keys),
                _bulk(b"%d" % count) + _bulk(b"%d" % n),
            )
        xread, evalsha, rest = parts
        position = _bulk(str(after).encode())
        return b"".join((xread, position * n, evalsha, position, rest))

    async def _wait_and_tail(self, command: bytes) -> Any:
        """Send `_tail_command`'s pipeline on the connection the tail keeps (`Channel`) and
        read both replies off it: tail.lua's reply, or None when Redis does not have the script.
        The XREAD reply only wakes; it is not turned into objects beyond hiredis's parse."""
        channel = self._channel
        if channel is None:
            channel = self._channel = Channel(self.redis.connection_pool, "tail")
            if self._reads_abandoned:
                channel.abandon()
        try:
            woke, reply = await channel.exchange(command, 2, retry=True)
        except Sent as sent:
            assert sent.__cause__ is not None
            raise sent.__cause__ from None
        if isinstance(woke, Exception):
            raise woke
        if isinstance(reply, redis.exceptions.NoScriptError):
            return None
        if isinstance(reply, Exception):
            raise reply
        return reply

    def abandon_reads(self) -> None:
        """End a blocking tail read in progress now, and any later one, as `BucketUnavailable`
        before anything is sent: their reader is stopping (`Tail.stop`)."""
        self._reads_abandoned = True
        if self._channel is not None:
            self._channel.abandon()

    async def renew_epoch(self, known: str) -> str:
        """Start a new epoch if the bucket's is still `known` (a rollback was seen); returns the
        bucket's epoch after it ('' when the bucket has none)."""
        async with translate_redis_errors("epoch"):
            epoch: Any = await self._renew_epoch(keys=self.keys.common, args=[known, new_epoch()])
        return str(epoch.decode())

    async def trim(self, max_age: float | None, max_items: int | None = None) -> int:
        """Remove items older than `max_age` seconds (Redis' clock) and the oldest beyond
        `max_items`, across every partition, and forget the idempotency keys older than
        `max_age`. Returns how many items were removed."""
        removed = 0
        while True:
            async with translate_redis_errors("trim"):
                count, more = await self._trim(
                    keys=[*self.keys.common, *self.keys.idempotency_pair],
                    args=[int((max_age or 0) * 1000), max_items or 0, TRIM_BATCH],
                )
            removed += int(count)
            if not more:
                return removed
            max_age = None

    # --- cursors stored for feed consumers -------------------------------------------------

    async def save_cursors(
        self,
        consumer: str,
        cursorset: str,
        cursors: Mapping[int, str],
        *,
        max_age: float,
        most: int,
    ) -> bool:
        """Store `cursors` in the consumer's `cursorset`, which then lives `max_age` seconds.
        False (nothing stored) when that is a new set and the consumer has `most` already."""
        if not cursors:
            return True
        args: list[Any] = [cursorset, max(1, int(max_age * 1000)), most]
        for partition, cursor in cursors.items():
            args += [partition, cursor]
        async with translate_redis_errors("cursorset"):
            stored = await self._save_cursors(
                keys=[self.keys.cursorsets(consumer), self.keys.cursorset(consumer, cursorset)],
                args=args,
            )
        return bool(stored)

    async def load_cursors(
        self, consumer: str, cursorset: str, partitions: Sequence[int]
    ) -> dict[int, str | None]:
        async with translate_redis_errors("cursorset"):
            values: Any = await self.redis.hmget(
                self.keys.cursorset(consumer, cursorset), [str(p) for p in partitions]
            )
        return {p: v.decode() if v else None for p, v in zip(partitions, values, strict=True)}

    # --- the micro-batches of Spark streaming writers ----------------------------------------

    async def batch_recorded(self, writer: str, batch: int) -> str | None:
        """What `writer` recorded for micro-batch `batch` when it committed it, or None."""
        async with translate_redis_errors("spark ledger"):
            summary: Any = await self.redis.hget(self.keys.ledger(writer), str(batch))
        return summary.decode() if summary is not None else None

    async def ledger(self, writer: str) -> dict[int, str]:
        """Every micro-batch `writer` recorded (batch id -> what it recorded)."""
        async with translate_redis_errors("spark ledger"):
            entries: Any = await self.redis.hgetall(self.keys.ledger(writer))
        return {int(batch): summary.decode() for batch, summary in entries.items()}

    async def record_batch(
        self, writer: str, batch: int, summary: str, retain: int, ttl_ms: int | None = None
    ) -> None:
        """Record micro-batch `batch` of `writer` as committed (the first record stays) and
        forget the one `retain` batches older; with `ttl_ms`, the whole record expires that long
        after its newest micro-batch."""
        ledger = self.keys.ledger(writer)
        async with (
            translate_redis_errors("spark ledger"),
            self.redis.pipeline(transaction=True) as pipe,
        ):
            pipe.hsetnx(ledger, str(batch), summary)
            if batch >= retain:
                pipe.hdel(ledger, str(batch - retain))
            if ttl_ms is not None:
                pipe.pexpire(ledger, ttl_ms)
            await pipe.execute()

    async def txn_record(self, app_id: str) -> str | None:
        """The record of the newest version a Spark job of `app_id` committed
        ("<version> <summary>"), or None (never, or expired)."""
        async with translate_redis_errors("spark txn"):
            record: Any = await self.redis.get(self.keys.txn(app_id))
        return record.decode() if record is not None else None

    async def record_txn(self, app_id: str, version: int, summary: str, ttl_ms: int) -> str:
        """Record `version` of `app_id` as committed ("<version> <summary>"), expiring after
        `ttl_ms`, unless a version as high is recorded; returns the record that stands.

        A check-and-set (WATCH, MULTI): a concurrent record makes it look again."""
        key = self.keys.txn(app_id)
        record = f"{version} {summary}"
        async with translate_redis_errors("spark txn"), self.redis.pipeline() as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    known: Any = await pipe.get(key)
                    if known is not None:
                        found = known.decode()
                        number = found.partition(" ")[0]
                        if number.isdigit() and int(number) >= version:
                            return str(found)
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.set(key, record, px=ttl_ms)
                    await pipe.execute()
                    return record
                except redis.exceptions.WatchError:
                    continue

    async def states(self, resource: str, ids: Sequence[str]) -> list[bytes | None]:
        """The stored states of `ids` (JSON bytes, None where none is stored), in order."""
        if not ids:
            return []
        async with translate_redis_errors("states"):
            found: Any = await self.redis.hmget(self.keys.state(resource), list(ids))
        return [None if state is None else bytes(state) for state in found]

    async def stored_resources(self) -> list[str]:
        """The resources with a stored state in the bucket (their index exists), sorted."""
        prefix = self.keys.index("")
        found: set[str] = set()
        async with translate_redis_errors("store"):
            async for key in self.redis.scan_iter(match=_glob_escape(prefix) + "*", count=1000):
                found.add(bytes(key).decode().removeprefix(prefix))
        return sorted(found)

    # --- reading the store ---------------------------------------------------------------

    async def page(self, resource: str, after_id: str | None, limit: int) -> StatePage:
        """Up to `limit` stored states of `resource` with ids after `after_id`, in id order."""
        start = "-" if after_id is None else "(" + after_id
        return await self.page_pieces(resource, [Piece(start, "+")], limit)

    async def page_pieces(self, resource: str, pieces: Sequence[Piece], limit: int) -> StatePage:
        """Up to `limit` stored states of `resource` whose ids are in `pieces` (ids and ranges of
        the index, in id order), with the bucket head: one snapshot, one round trip."""
        args: list[str | int] = [limit]
        for piece in pieces:
            args += piece.arguments()
        async with translate_redis_errors("page"):
            ids, states, head, epoch = await self._page(
                keys=[*self.keys.common, self.keys.index(resource), self.keys.state(resource)],
                args=args,
            )
        cursor = Cursor(epoch.decode(), StreamId.parse(head)) if epoch else None
        return StatePage([i.decode() for i in ids], list(states), cursor)

    async def get(self, resource: str, id: str) -> bytes | None:
        """The stored state of one resource object as JSON bytes, or None."""
        async with translate_redis_errors("get"):
            state: Any = await self.redis.hget(self.keys.state(resource), id)
        return state if state is None else bytes(state)

    # --- the fleet: publishers advertising themselves ---------------------------------------

    async def advertise(self, publisher_id: str, report: bytes, ttl: float) -> None:
        """Store `report` as publisher `publisher_id`'s, living `ttl` seconds unless renewed.

        The index of publishers forgets an id ten TTLs after its last advertisement (by this
        host's clock); `publishers()` drops earlier whoever's report has expired.
        """
        now_ms = int(time.time() * 1000)
        ttl_ms = max(int(ttl * 1000), 1)
        async with translate_redis_errors("advertise"):
            pipe = self.redis.pipeline(transaction=True)
            pipe.set(self.keys.publisher(publisher_id), report, px=ttl_ms)
            pipe.zadd(self.keys.publishers, {publisher_id: now_ms})
            pipe.zremrangebyscore(self.keys.publishers, "-inf", now_ms - 10 * ttl_ms)
            await pipe.execute()

    async def withdraw(self, publisher_id: str) -> None:
        """Remove publisher `publisher_id`'s report at once (it stops cleanly)."""
        async with translate_redis_errors("withdraw"):
            pipe = self.redis.pipeline(transaction=True)
            pipe.delete(self.keys.publisher(publisher_id))
            pipe.zrem(self.keys.publishers, publisher_id)
            await pipe.execute()

    async def publishers(self) -> list[tuple[str, bytes, float]]:
        """Every live publisher's (id, report, seconds its report has left to live), by id."""
        async with translate_redis_errors("publishers"):
            ids: Any = await self.redis.zrange(self.keys.publishers, 0, -1)
            names = sorted(i.decode() for i in ids)
            if not names:
                return []
            pipe = self.redis.pipeline(transaction=False)
            for name in names:
                pipe.get(self.keys.publisher(name))
                pipe.pttl(self.keys.publisher(name))
            replies = await pipe.execute()
            out = []
            gone = []
            for i, name in enumerate(names):
                report, left_ms = replies[2 * i], replies[2 * i + 1]
                if report is None:
                    gone.append(name)
                else:
                    out.append((name, bytes(report), max(int(left_ms), 0) / 1000))
            if gone:
                await self.redis.zrem(self.keys.publishers, *gone)
        return out

    async def aclose(self) -> None:
        for channel in (self._channel, self._commits):
            if channel is not None:
                await channel.drop()
        await self.redis.aclose()


__all__ = [
    "BATCH",
    "IDEMPOTENCY_KEYS",
    "REPLICAS_TIMEOUT",
    "TRIM_BATCH",
    "Batch",
    "ChangeBucket",
    "EncodedBatch",
    "KeyOf",
    "StreamStats",
    "connect",
    "translate_redis_errors",
]
