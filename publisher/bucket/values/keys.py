"""The Redis keys of a bucket, and which partition a change goes to.

Every key of a bucket named `name` carries the hash tag ``{name}``, so a Redis Cluster keeps them
in one slot and the scripts may touch any of them::

    {name}:log              stream: one entry per change item (fields r, s, i); with several
                            partitions one stream per partition, {name}:log:<p>, and no :log
    {name}:epoch            string: the bucket's epoch, created with the bucket
    {name}:epoch:at         string: when the epoch began (Redis's ms; set by its creation and
                            by each renewal): commit.lua takes a writer's witness missing from
                            the history and older than that as lost before the epoch began,
                            announced already
    {name}:partitions       string: the partition count, created with the bucket
    {name}:last             string: the newest entry id given out (the head)
    {name}:trimmed          string: the newest stream id ever trimmed (resume horizon)
    {name}:state:<resource> hash: id -> the resource's state, as committed (JSON)
    {name}:index:<resource> sorted set, all scores 0: ids, for keyset pagination by id
    {name}:idem             hash: idempotency key -> "<epoch> <ms> <first seq> <count> <digest>"
    {name}:idem:at          sorted set: idempotency key, scored by the ms of its commit
    {name}:cursorsets:<c>   sorted set: a feed consumer's cursor set names, by last store (ms)
    {name}:cursorset:<c>:<s> hash: partition -> cursor of consumer c's set s (expires)
    {name}:spark:<query>    hash: the micro-batches a Spark streaming query committed
    {name}:sparktxn:<app>   string: "<version> <count> <first cursor> <last cursor>", the
                            newest version a Spark job of txnAppId <app> committed (expires)
    {name}:publishers       sorted set: the publishers that advertised themselves, by the ms of
                            their last advertisement (an index; the reports below decide)
    {name}:publisher:<id>   string: publisher <id>'s report (JSON), expiring after its TTL
    {name}:durables         set: the names of the durable consumers
    {name}:durable:<c>      hash: durable consumer c's config, incarnation, epoch, position,
                            counters; with :pending (sorted set), :items, :deliveries (hashes)
                            and :dead (stream: its dead-letter record)
                            (publisher.bucket.stores.durable)
"""

from __future__ import annotations

import hashlib


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
        self.idempotency = f"{tag}:idem"
        """Idempotency key -> the reply of the commit that first used it."""
        self.idempotency_times = f"{tag}:idem:at"
        self.publishers = f"{tag}:publishers"
        """The ids of the publishers that advertised themselves (`publisher(id)`)."""
        """Idempotency keys by the time of their commit: the oldest are forgotten first."""
        self._tag = tag

    @property
    def common(self) -> list[str]:
        """The first KEYS of every script: log, epoch, partitions, last, trimmed."""
        return [self.log, self.epoch, self.partitions, self.last, self.trimmed]

    @property
    def idempotency_pair(self) -> list[str]:
        """KEYS 6 and 7 of the commit and trim scripts."""
        return [self.idempotency, self.idempotency_times]

    def stream(self, partition: int, partitions: int) -> str:
        """The stream holding partition `partition` of a log split into `partitions`."""
        return self.log if partitions == 1 else f"{self.log}:{partition}"

    def state(self, resource: str) -> str:
        return f"{self._tag}:state:{resource}"

    def index(self, resource: str) -> str:
        return f"{self._tag}:index:{resource}"

    def cursorsets(self, consumer: str) -> str:
        """The consumer's cursor set names, each scored with the time it was last stored."""
        return f"{self._tag}:cursorsets:{consumer}"

    def cursorset(self, consumer: str, cursorset: str) -> str:
        """One cursor set: partition -> cursor (names hold no ':', so keys never collide)."""
        return f"{self._tag}:cursorset:{consumer}:{cursorset}"

    def publisher(self, publisher_id: str) -> str:
        """A publisher's report of itself, expiring unless it advertises again in time."""
        return f"{self._tag}:publisher:{publisher_id}"

    def ledger(self, writer: str) -> str:
        """The micro-batches a Spark streaming query (`writer`) committed."""
        return f"{self._tag}:spark:{writer}"

    @property
    def replicated(self) -> str:
        """Written before a WAIT for replicas: a write of the waiting connection, after the
        commit it waits for (`ChangeBucket.wait_for_replicas`)."""
        return f"{self._tag}:replicated"

    def durable(self, consumer: str) -> list[str]:
        """A durable consumer's keys: its hash, pending, items, deliveries, dead-letter record,
        and the index of every durable consumer's name (KEYS 6-11 of durable.lua)."""
        base = f"{self._tag}:durable:{consumer}"
        return [base, f"{base}:pending", f"{base}:items", f"{base}:deliveries", f"{base}:dead",
                f"{self._tag}:durables"]

    def txn(self, app_id: str) -> str:
        """The newest version a Spark job of `app_id` (its txnAppId) committed."""
        return f"{self._tag}:sparktxn:{app_id}"


def partition_of(changed_resource_id: str, partitions: int) -> int:
    """The partition of a change: the first 32 bits of SHA-1(id) mod `partitions`, exactly as
    commit.lua computes it, so every publisher and Spark job agrees."""
    digest = hashlib.sha1(changed_resource_id.encode()).hexdigest()
    return int(digest[:8], 16) % partitions


__all__ = ["Keys", "partition_of"]
