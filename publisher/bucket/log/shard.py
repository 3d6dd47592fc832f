"""A shard of a bucket: one slot-local log with one id sequence, and the store beside it.

Every key of a shard carries one hash tag (`Keys`), so each of its scripts (tail, read, retention,
trim, page, commit) runs on one Redis, or on the one master of a Redis Cluster that holds the
slot. A shard holds one or more of the bucket's partitions: a single Redis bucket is one shard of
N partitions sharing its sequence (streams ``{name}:log:<p>``, one ``last``); a bucket in a Redis
Cluster is N shards of one partition each, under ``{name/p}`` (`publisher.bucket.log.layout`
decides). Nothing outside the bucket package sees a `Shard` but through `Log.shards()`, for the
tail's and the replays' reads.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from changefeed.cursor import StreamId
from publisher.bucket.log.commits import Committer
from publisher.bucket.lua import scripts
from publisher.bucket.redis.channel import Channel, Sent
from publisher.bucket.redis.connection import bulk, translate_redis_errors
from publisher.bucket.values.changes import (
    LogEntry,
    LogRead,
    Piece,
    Retention,
    StatePage,
    merge_partitions,
    parse_entry,
)
from publisher.bucket.values.keys import Keys

_bulk = bulk

TRIM_BATCH = 10000
"""Most items (and idempotency keys) one trim call removes (the rest go in the next call)."""


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


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



class Shard:
    """One log with one id sequence under the hash tag of `tag` (see the module's docstring).

    `index` is the shard's number in its bucket; `partitions` the partition count its keys must
    have (None: whatever they were created with); `direct`: `client` talks to one server (else a
    Redis Cluster client, through which each call goes to the slot's master)."""

    def __init__(
        self, client: aioredis.Redis, tag: str, index: int, partitions: int | None,
        idempotency_keys: int, *, direct: bool, what: str = "commit",
    ) -> None:
        self.redis = client
        self.index = index
        self.keys = Keys(tag)
        self.partitions = partitions
        self.direct = direct
        self.commits = Committer(client, self.keys, tag, partitions, idempotency_keys,
                                 direct=direct, what=what)
        self._known_partitions: int | None = None
        self._ensure = client.register_script(scripts.ENSURE.text)
        self._trim = client.register_script(scripts.TRIM.text)
        self._retention = client.register_script(scripts.RETENTION.text)
        self._page = client.register_script(scripts.PAGE.text)
        self._tail = client.register_script(scripts.TAIL.text)
        self._renew_epoch = client.register_script(scripts.RENEW_EPOCH.text)
        self._tail_packed: dict[tuple[int, int, int], tuple[bytes, bytes, bytes]] = {}
        self._channel: Channel | None = None
        """The connection the blocking tail reads keep (made at the first)."""
        self._reads_abandoned = False

    # --- identity ------------------------------------------------------------------------

    async def ensure(self, candidate: str) -> tuple[str, int]:
        """The shard's epoch and partition count, creating its keys with `candidate` as the
        epoch if it has none. Raises PartitionMismatch when it has another partition count."""
        async with translate_redis_errors("epoch"):
            epoch, partitions = await self._ensure(
                keys=self.keys.common, args=[candidate, self.partitions or ""]
            )
        self._known_partitions = int(partitions)
        return str(epoch.decode()), int(partitions)

    async def set_epoch(self, epoch: str) -> None:
        """Give the shard the bucket's epoch (a shard of a bucket in a Redis Cluster holds a
        copy of it, which its scripts check)."""
        found, _ = await self.ensure(epoch)
        if found != epoch:
            async with translate_redis_errors("epoch"):
                # The shard's history goes on under the bucket's epoch (its `epoch:at` stays:
                # no change of it was lost).
                await self.redis.set(self.keys.epoch, epoch)

    async def current_epoch(self) -> str | None:
        """The shard's epoch, or None when its keys do not exist (yet, or any more)."""
        async with translate_redis_errors("epoch"):
            epoch: Any = await self.redis.get(self.keys.epoch)
        if epoch is None:
            self._known_partitions = None
        return epoch.decode() if epoch else None

    async def partition_count(self) -> int:
        """How many partitions the shard's log has (learnt once its keys exist)."""
        if self._known_partitions is None:
            async with translate_redis_errors("partitions"):
                stored = await self.redis.get(self.keys.partitions)
            if stored is None:
                return self.partitions or 1
            self._known_partitions = int(stored)
        return self._known_partitions

    async def streams(self) -> list[str]:
        """The shard's partition streams, its partition 0 first."""
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

    async def renew_epoch(self, known: str, new: str) -> str:
        """Start epoch `new` if the shard's is still `known`; returns the epoch after it."""
        async with translate_redis_errors("epoch"):
            epoch: Any = await self._renew_epoch(keys=self.keys.common, args=[known, new])
        return str(epoch.decode())

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
            if len(streams) == 1:
                rows: Any = await self.redis.xrevrange(streams[0], end, start, count=count)
                return [parse_entry(entry_id, fields) for entry_id, fields in rows]
            pipe = self.redis.pipeline(transaction=True)
            for key in streams:
                pipe.xrevrange(key, end, start, count=count)
            replies = await pipe.execute()
        parts = [[parse_entry(i, f) for i, f in rows] for rows in replies]
        return merge_partitions(parts, count, newest_first=True)

    async def read_partitions(
        self, after: Mapping[int, StreamId], count: int
    ) -> tuple[dict[int, list[LogEntry]], StreamId, str | None]:
        """Up to `count` entries of each of the shard's partitions in `after` after its
        position, oldest first, and the shard's head and epoch at the same instant (one
        snapshot)."""
        n = await self.partition_count()
        if n == 1 and list(after) == [0]:
            read = await self.tail(after[0], None, count)
            return {0: read.entries}, read.head, read.epoch
        async with translate_redis_errors("read"):
            pipe = self.redis.pipeline(transaction=True)
            for partition, position in after.items():
                pipe.xrange(self.keys.stream(partition, n), f"({position}", "+", count=count)
            pipe.get(self.keys.last)
            pipe.get(self.keys.trimmed)
            pipe.get(self.keys.epoch)
            *replies, last, trimmed, epoch = await pipe.execute()
        entries = {
            partition: [parse_entry(i, f) for i, f in rows]
            for partition, rows in zip(after, replies, strict=True)
        }
        head = StreamId.parse(last or trimmed or b"0-0")
        return entries, head, epoch.decode() if epoch is not None else None

    async def tail(self, after: StreamId, block_ms: int | None, count: int = 1000) -> LogRead:
        """Up to `count` entries per partition after `after`, with the checks of `LogRead`.

        With `block_ms` an `XREAD BLOCK` (COUNT 1) first waits up to that long for an entry after
        `after`, and the tail script is pipelined behind it: Redis runs the script as soon as the
        wait ends, so waiting, reading and checking cost one round trip. The blocking read only
        wakes; the entries come from the script (XREAD BLOCK cannot run in a script), atomic
        with the checks. Without `block_ms` it is the script alone.
        """
        n = await self.partition_count()
        if block_ms is not None and not self.direct:
            # A cluster client does not pipeline scripts: the XREAD BLOCK that waits is sent
            # first, and the tail script once it returned (a round trip more per wake).
            async with translate_redis_errors("tail"):
                await self.redis.xread({s: str(after) for s in await self.streams()},
                                       count=1, block=block_ms)
            block_ms = None
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

    # --- the store and retention ---------------------------------------------------------

    async def trim(self, max_age: float | None, max_items: int | None = None) -> int:
        """Remove items older than `max_age` seconds (Redis' clock) and the oldest beyond
        `max_items`, across the shard's partitions, and forget the idempotency keys older than
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

    async def states(self, resource: str, ids: Sequence[str]) -> list[bytes | None]:
        """The stored states of `ids` (JSON bytes, None where none is stored), in order."""
        if not ids:
            return []
        async with translate_redis_errors("states"):
            found: Any = await self.redis.hmget(self.keys.state(resource), list(ids))
        return [None if state is None else bytes(state) for state in found]

    async def stored_resources(self) -> set[str]:
        """The resources with a stored state in the shard (their index exists)."""
        prefix = self.keys.index("")
        found: set[str] = set()
        async with translate_redis_errors("store"):
            async for key in self.redis.scan_iter(match=_glob_escape(prefix) + "*", count=1000):
                found.add(bytes(key).decode().removeprefix(prefix))
        return found

    async def page_pieces(
        self, resource: str, pieces: Sequence[Piece], limit: int
    ) -> tuple[StatePage, str | None, StreamId]:
        """Up to `limit` stored states of `resource` whose ids are in `pieces` (ids and ranges of
        the index, in id order), with the shard's epoch and head: one snapshot, one round trip."""
        args: list[str | int] = [limit]
        for piece in pieces:
            args += piece.arguments()
        async with translate_redis_errors("page"):
            ids, states, head, epoch = await self._page(
                keys=[*self.keys.common, self.keys.index(resource), self.keys.state(resource)],
                args=args,
            )
        page = StatePage([i.decode() for i in ids], list(states), None)
        return page, epoch.decode() or None, StreamId.parse(head)

    async def get(self, resource: str, id: str) -> bytes | None:
        """The stored state of one resource object as JSON bytes, or None."""
        async with translate_redis_errors("get"):
            state: Any = await self.redis.hget(self.keys.state(resource), id)
        return state if state is None else bytes(state)

    async def wait_for_replicas(self, replicas: int, timeout: float) -> int:
        """Wait up to `timeout` seconds until `replicas` replicas of the shard's master have
        every write it acknowledged before this call; returns how many had them (Redis WAIT).

        WAIT counts the replicas that have the writes *of its own connection*. So this writes a
        marker on the connection it waits on: the replication stream is in order, and a replica
        that has the marker has every commit acknowledged before it was written, whichever
        connection sent those. One round trip, and the commit path is untouched. In a Redis
        Cluster the marker is under the shard's hash tag, so both go to the shard's master.
        """
        async with translate_redis_errors("wait for replicas"):
            if self.direct:
                pipe = self.redis.pipeline(transaction=False)
                pipe.set(self.keys.replicated, str(time.time()), px=60_000)
                pipe.execute_command("WAIT", replicas, max(1, int(timeout * 1000)))
                _, acknowledged = await pipe.execute()
            else:
                acknowledged = await self._wait_on_master(replicas, timeout)
        return int(acknowledged)

    async def _wait_on_master(self, replicas: int, timeout: float) -> Any:
        """SET the marker and WAIT on one connection to the master of the shard's slot."""
        client: Any = self.redis
        await client.initialize()  # knows the slots (a no-op once it does)
        node = client.get_node_from_key(self.keys.replicated)
        connection = node.acquire_connection()
        try:
            await connection.send_packed_command(connection.pack_commands([
                ("SET", self.keys.replicated, str(time.time()), "PX", 60_000),
                ("WAIT", replicas, max(1, int(timeout * 1000))),
            ]))
            await connection.read_response()
            return await connection.read_response()
        except BaseException:
            await connection.disconnect()
            raise
        finally:
            node.release(connection)

    async def aclose(self) -> None:
        """Drop the connections the shard keeps (not the client's pool)."""
        if self._channel is not None:
            await self._channel.drop()
        await self.commits.drop()


__all__ = ["TRIM_BATCH", "Shard"]
