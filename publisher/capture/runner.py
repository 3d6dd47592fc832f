"""`CaptureRunner`: the capture as a background task of the publisher, and the bucket side of
its sessions (publisher.capture.session, in a thread).

Each PostgreSQL transaction is one atomic commit of the bucket (a batch of `commit_batches`: one
script call, whatever its size, or a part of one that holds several small transactions, each
applied whole under its own key; a group of consecutive transactions goes in one round trip; on
a Redis Cluster, `commit_many`: atomic per partition), under the idempotency key
`capture:<slot>:<copy lsn>:<commit lsn>`. A transaction the slot sends again after a restart
(the bucket acknowledged it, the slot's confirmed position had not moved yet) is found applied by
its key before it is planned (`CaptureMarks.before_commit`) and writes nothing; should a race
get past that, the bucket refuses the key as reused with other changes, which says the same. A
commit that comes back in another epoch than the copy's, or a mark gone from the bucket, means
the bucket lost what it held: a new slot, a new copy, a new epoch (every listener resyncs).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any, TypeVar

import orjson
import structlog

from changefeed.errors import BucketUnavailable, CaptureError, ChangeError
from changefeed.protocol import Resource
from changefeed.tasks import cancel_and_wait
from publisher.bucket import BATCH, Change, ChangeBucket
from publisher.bucket.stores.capture_marks import CaptureMarks, Mark
from publisher.capture import pgoutput as po
from publisher.capture.assemble import Transaction
from publisher.capture.rows import RowChange, SetAside, plan
from publisher.capture.session import PG_EPOCH, Recopy, Session
from publisher.capture.stats import CaptureStats
from publisher.config.capture import Capture

log = structlog.get_logger(__name__)
T = TypeVar("T")

BACKOFF = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
"""Seconds between attempts after PostgreSQL or the bucket failed (the last repeats)."""
STOP_GRACE = 1.0
"""Seconds a stopped session may take to end before its connections are shut down."""
DDL_REPORTS = 20
"""DDL reports kept for /changefeeds/stats (the log has every one)."""


class CaptureRunner:
    """Streams config.js's `capture` into `bucket` while this publisher holds its lock.

    >>> runner = CaptureRunner(bucket, config.capture, config.resource_map, url, "pub-1")
    >>> runner.start(); ...; await runner.stop()
    """

    def __init__(self, bucket: ChangeBucket, config: Capture, resources: Mapping[str, Resource],
                 url: str, name: str) -> None:
        self.bucket = bucket
        self.config = config
        self.sub_resources = {name: r.sub_resources for name, r in resources.items()}
        self.url = url
        self.name = name
        self.stats = CaptureStats()
        self.marks = CaptureMarks(bucket.redis, bucket.name)
        self._stop = threading.Event()
        self._thread = concurrent.futures.ThreadPoolExecutor(1, "changefeed-capture")
        self._task: asyncio.Task[None] | None = None
        self._session: Session | None = None

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.create_task(self.run(), name="capture")
        return self._task

    async def stop(self) -> None:
        """Stop the capture and wait for its task. The task's own cancellation is the stop's
        doing and ends here; the caller's (it is cancelled while it waits) goes on up."""
        self._stop.set()
        task, self._task = self._task, None
        try:
            if task is not None:
                await cancel_and_wait(task)
        finally:
            self._thread.shutdown(wait=False)

    async def run(self) -> None:
        """Run sessions until stopped: a failed one is logged and followed by another."""
        failures = 0
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            session = self._session = Session(self.config, self.url, self.name, self, loop,
                                              self._stop)
            done = loop.run_in_executor(self._thread, session.run)
            try:
                await asyncio.shield(done)
                failures = 0
            except asyncio.CancelledError:
                self._stop.set()
                await self._ended(session, done)
                raise
            except Recopy:
                failures = 0
                continue
            except CaptureError as exc:
                self.stats.failed("postgres")
                (log.warning if failures == 0 else log.debug)(
                    "capture: PostgreSQL failed, retrying", error=str(exc),
                    postgres=self.config.display_url)
            except Exception:  # a bug of ours or a driver's: loudly, and the capture goes on
                self.stats.failed("postgres")
                log.exception("capture: the session failed; starting over")
            finally:
                self.stats.stream(False)
            await asyncio.sleep(BACKOFF[min(failures, len(BACKOFF) - 1)])
            failures += 1

    async def _ended(self, session: Session, done: asyncio.Future[None]) -> None:
        """Wait for the stopped session's thread: STOP_GRACE seconds, then as long again with
        its connections shut down (a statement waiting on a server that does not answer would
        hold the stop up for ever); past that the thread is left to end on its own."""
        if not (await asyncio.wait({done}, timeout=STOP_GRACE))[0]:
            session.interrupt()
            await asyncio.wait({done}, timeout=STOP_GRACE)
        if done.done() and not done.cancelled():
            done.exception()  # retrieved: how a stopped session ended is no news

    # --- the Sink of the sessions --------------------------------------------------------

    async def mark(self) -> Mark | None:
        """The mark of the slot, if the bucket's epoch is still the copy's."""
        self.stats.stream(True)
        mark = await self._retry(partial(self.marks.read, self.config.slot), "capture mark")
        if mark is None:
            return None
        epoch = await self._retry(self.bucket.log.current_epoch, "read the epoch")
        return mark if epoch == mark.epoch else None

    async def copy_rows(self, rows: list[RowChange]) -> set[tuple[str, str]]:
        """Put the copied `rows` (the copy is not atomic: its new epoch ends it)."""
        planned = plan(rows, {}, self.sub_resources)  # the copy: no stored state counts
        changes = self._valid(planned.changes, planned.set_aside, 0)
        for start in range(0, len(changes), BATCH):
            chunk = changes[start : start + BATCH]
            await self._retry(partial(self.bucket.commit_many, chunk), "copy")
        await self._set_aside(planned.set_aside)
        return {(c.resource, c.changed_resource_id) for c in changes}

    async def finish_copy(self, seen: set[tuple[str, str]], lsn: int, reason: str) -> Mark:
        """Delete the stored ids the copy did not see, start a new epoch (every listener
        resyncs), and mark the copy as the one the slot's stream continues."""
        resources = {table.resource for table in self.config.tables}
        for resource in sorted(resources):
            stale: list[Change] = []
            after: str | None = None
            while True:
                page = await self._retry(partial(self.bucket.page, resource, after, BATCH), "copy")
                stale += [Change.delete(resource, id, self.sub_resources[resource])
                          for id in page.ids if (resource, id) not in seen]
                if len(page.ids) < BATCH:
                    break
                after = page.ids[-1]
            for start in range(0, len(stale), BATCH):
                chunk = stale[start : start + BATCH]
                await self._retry(partial(self.bucket.commit_many, chunk), "copy")
        epoch = await self._retry(self.bucket.log.ensure, "epoch")
        epoch = await self._retry(partial(self.bucket.log.renew_epoch, epoch), "epoch") or epoch
        vector = await self._retry(self.bucket.log.head, "head")
        head = str(vector.positions[0]) if vector is not None else ""
        mark = await self._retry(partial(self.marks.write, self.config.slot, epoch, lsn, head),
                                 "capture mark")
        self.stats.copied()
        log.warning("capture: tables copied; a new epoch tells every listener to resync",
                    slot=self.config.slot, rows=len(seen), epoch=epoch, reason=reason,
                    lsn=po.format_lsn(lsn))
        return mark

    async def apply(self, txns: list[Transaction], mark: Mark) -> bool:
        """Commit each of `txns` (consecutive, in commit order) atomically under its key, all in
        one round trip (small ones several to a script call); False when the bucket lost its
        state (copy again)."""
        keys = [f"capture:{self.config.slot}:{mark.lsn}:{txn.lsn}" for txn in txns]
        (marked, known), stored = await asyncio.gather(  # two reads in one round trip's time
            self._retry(partial(self.marks.before_commit, self.config.slot, keys), "capture mark"),
            self._stored(txns))
        if not marked:
            log.error("capture: the bucket lost the capture's mark (Redis lost its data?); "
                      "copying the tables again", slot=self.config.slot)
            return False
        todo = [(txn, key) for txn, key, was in zip(txns, keys, known, strict=True)
                if not (was and self.bucket.log.ordered)]
        if len(todo) < len(txns):
            log.info("capture: transactions sent again were applied already",
                     count=len(txns) - len(todo))
        batches: list[tuple[list[Change], str]] = []
        set_aside: list[SetAside] = []
        for txn, key in todo:
            planned = plan(await self._truncates(txn, stored) + txn.rows, stored,
                           self.sub_resources, txn.lsn)
            aside = txn.set_aside + planned.set_aside
            changes = self._valid(planned.changes, aside, txn.lsn)
            set_aside += aside
            if changes:
                batches.append((changes, key))
        epochs = await self._commit(batches)
        await self._set_aside(set_aside)
        if any(epoch is not None and epoch != mark.epoch for epoch in epochs):
            log.error("capture: the bucket lost its state (a commit came back in another "
                      "epoch); copying the tables again", slot=self.config.slot)
            await self._retry(partial(self.marks.forget, self.config.slot), "capture mark")
            return False
        last = txns[-1]
        assert last.commit is not None
        self.stats.applied(
            len(todo), sum(len(changes) for changes, _ in batches),
            max(0.0, time.time() - last.commit.commit_time / 1e6 - PG_EPOCH), last.end_lsn)
        return True

    def ddl(self, report: str) -> None:
        log.error("capture: a mapped table changed", slot=self.config.slot, report=report)
        self.stats.reported(report, DDL_REPORTS)

    def lag(self, lag_bytes: int | None, confirmed: int) -> None:
        self.stats.lagged(lag_bytes, confirmed)

    # --- helpers -------------------------------------------------------------------------

    async def _stored(self, txns: list[Transaction]) -> dict[tuple[str, str], Any]:
        """The bucket's state of every (resource, id) the transactions' rows touch."""
        wanted: dict[str, set[str]] = {}
        for txn in txns:
            for row in txn.rows:
                wanted.setdefault(row.table.resource, set()).add(row.id)
                if row.old_id is not None:
                    wanted[row.table.resource].add(row.old_id)
        stored: dict[tuple[str, str], Any] = {}
        for resource, ids in wanted.items():
            ordered = sorted(ids)
            states = await self._retry(partial(self.bucket.log.states, resource, ordered), "states")
            for id, state in zip(ordered, states, strict=True):
                stored[(resource, id)] = None if state is None else orjson.loads(state)
        return stored

    async def _truncates(self, txn: Transaction, stored: dict[tuple[str, str], Any]
                         ) -> list[RowChange]:
        """A TRUNCATE of a mapped table: a delete of every id its resource stores (applied
        before the transaction's rows)."""
        out: list[RowChange] = []
        for table in txn.truncated:
            after: str | None = None
            while True:
                read = partial(self.bucket.page, table.resource, after, BATCH)
                page = await self._retry(read, "page")
                out += [RowChange(table, id, None) for id in page.ids]
                stored.update({(table.resource, id): None for id in page.ids})
                if len(page.ids) < BATCH:
                    break
                after = page.ids[-1]
        return out

    def _valid(self, changes: list[Change], set_aside: list[SetAside], lsn: int) -> list[Change]:
        """The changes the bucket accepts; the others set aside with the bucket's reason."""
        out = []
        for change in changes:
            try:
                self.bucket.log.validate(change)
            except ChangeError as exc:
                set_aside.append(SetAside(change.resource, change.changed_resource_id,
                                          str(exc), lsn))
                continue
            out.append(change)
        return out

    async def _commit(self, batches: list[tuple[list[Change], str]]) -> list[str | None]:
        """Commit each batch atomically under its key, in order (in one round trip; small
        batches several to a script call): the epoch each landed in, None for one whose key was
        known with other changes (applied already)."""
        if not batches:
            return []
        if self.bucket.log.ordered:
            try:
                done = await self._retry(partial(self.bucket.log.commit_batches, batches), "commit")
            except ChangeError as exc:
                if "idempotency key" not in str(exc):
                    raise
            else:
                return [committed.epoch for committed in done]
        return [await self._commit_one(changes, key) for changes, key in batches]

    async def _commit_one(self, changes: list[Change], key: str) -> str | None:
        try:
            if not self.bucket.log.ordered:
                commit = partial(self.bucket.commit_many, changes, key=key)
                cursors = await self._retry(commit, "commit")
                return cursors[0].split(".", 1)[0]
            (committed,) = await self._retry(
                partial(self.bucket.log.commit_batches, [(changes, key)]), "commit")
        except ChangeError as exc:
            if "idempotency key" not in str(exc):
                raise
            log.info("capture: a transaction sent again was applied already", key=key)
            return None
        return committed.epoch

    async def _set_aside(self, rows: list[SetAside]) -> None:
        if not rows:
            return
        self.stats.aside(len(rows))
        for row in rows:
            log.error("capture: row set aside", slot=self.config.slot, table=row.table,
                      id=row.id, reason=row.reason, lsn=po.format_lsn(row.lsn))
        await self._retry(partial(
            self.marks.set_aside, self.config.slot, [orjson.dumps(r.report()) for r in rows]),
            "set aside")

    async def _retry(self, attempt: Callable[[], Awaitable[T]], what: str) -> T:
        """`attempt()`, again while the bucket is unavailable (the session waits; PostgreSQL
        keeps the transaction in the slot). A commit retried after no answer came carries its
        idempotency key: it is written once."""
        failures = 0
        while True:
            try:
                return await attempt()
            except BucketUnavailable as exc:
                self.stats.failed("bucket")
                (log.warning if failures == 0 else log.debug)(
                    "capture: bucket unavailable; PostgreSQL keeps the changes", what=what,
                    error=str(exc))
            await asyncio.sleep(BACKOFF[min(failures, len(BACKOFF) - 1)])
            failures += 1
