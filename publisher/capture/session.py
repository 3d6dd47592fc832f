"""One capture session, blocking, in a thread of its own: take the capture's lock, make sure of
the slot and of the copy its stream continues, then stream the slot into the bucket.

psycopg2's replication connection is blocking; the session runs in a thread and hands each
committed transaction to the event loop (`Sink`, carried out by publisher.capture.runner),
waiting for the bucket's answer before it confirms the transaction's end to PostgreSQL. So the
slot's confirmed position never passes a transaction the bucket has not acknowledged. The
complete transactions that arrived while the bucket answered go together (`GROUP`), each still
its own atomic commit (small ones several to a script call, each under its own key); the
session holds at most two groups: the one the bucket commits (`Flight`) and the one it reads
meanwhile.

One publisher streams a slot at a time: the session that holds the advisory lock of the slot
(on its plain connection; a standby tries for it every `takeoverInterval` seconds, and gets it
when the holder's session ends, a SIGKILLed publisher's at once).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import select
import socket
import threading
import time
import zlib
from collections.abc import Coroutine
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import structlog

from changefeed.errors import CaptureError
from publisher.bucket.stores.capture_marks import Mark
from publisher.capture import database
from publisher.capture import pgoutput as po
from publisher.capture.assemble import Assembler, Transaction
from publisher.capture.database import query, translate_postgres_errors
from publisher.capture.rows import RowChange, Shape
from publisher.config.capture import Capture, Table

log = structlog.get_logger(__name__)
T = TypeVar("T")

LOCK_CLASS = 0x63617074  # "capt"
"""The first key of the capture's advisory lock; the second is a hash of the slot's name."""
COPY_BATCH = 1000
"""Rows of a table read (and committed) per round of the copy."""
GROUP = 1000
"""Complete transactions handed to the bucket at most at once (each its own atomic commit,
small ones several to a script call of up to 500 changes, the calls in one round trip): those
that arrived while the bucket answered the ones before."""
GROUP_ROWS = 2000
"""Rows of a group at most (a larger transaction goes alone)."""
PG_EPOCH = 946684800
"""PostgreSQL's timestamps count microseconds from 2000-01-01 UTC: that in Unix seconds."""


def lock_key(slot: str) -> int:
    return zlib.crc32(slot.encode()) - 2**31


class Stopped(Exception):
    """The capture is stopping: the session ends where it is."""


class Recopy(Exception):
    """The bucket lost what the stream continues: a new slot and a new copy are needed."""


class Sink(Protocol):
    """What the session asks of the event loop's side (publisher.capture.runner)."""

    async def mark(self) -> Mark | None: ...
    async def copy_rows(self, rows: list[RowChange]) -> set[tuple[str, str]]: ...
    async def finish_copy(self, seen: set[tuple[str, str]], lsn: int, reason: str) -> Mark: ...
    async def apply(self, txns: list[Transaction], mark: Mark) -> bool: ...
    def ddl(self, report: str) -> None: ...
    def lag(self, lag_bytes: int | None, confirmed: int) -> None: ...


@dataclass(slots=True)
class Slot:
    exists: bool
    lost: bool
    """wal_status 'lost': invalidated (max_slot_wal_keep_size), its changes gone."""


class Session:
    """One session of the capture (`run` until the connection fails or `stop` is set)."""

    def __init__(self, capture: Capture, url: str, name: str, sink: Sink,
                 loop: asyncio.AbstractEventLoop, stop: threading.Event) -> None:
        self.capture = capture
        self.url = url
        self.name = name
        self.sink = sink
        self.loop = loop
        self.stop = stop
        self.cursor: Any = None
        """The replication cursor while streaming (kept alive while the bucket answers)."""
        self.holding = False
        self._sockets: dict[int, socket.socket] = {}
        """A duplicate of each open connection's socket (by id of the connection): `interrupt`
        shuts them down from another thread."""

    def _connect(self, name: str, *, replication: bool = False) -> Any:
        conn = database.connect(self.url, name, replication=replication)
        self._sockets[id(conn)] = socket.socket(fileno=os.dup(conn.fileno()))
        return conn

    def _close(self, conn: Any) -> None:
        database.close(conn)
        if (dup := self._sockets.pop(id(conn), None)) is not None:
            dup.close()

    def interrupt(self) -> None:
        """Shut the session's connections down (from any thread): a statement that waits on a
        server that does not answer fails at once, and the session ends."""
        for dup in list(self._sockets.values()):
            with suppress(OSError):
                dup.shutdown(socket.SHUT_RDWR)

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the event loop and wait for it; meanwhile tell PostgreSQL we
        are alive (the walsender ends a silent session after wal_sender_timeout)."""
        return self.wait(asyncio.run_coroutine_threadsafe(coroutine, self.loop))

    def wait(self, future: concurrent.futures.Future[T]) -> T:
        """`future`'s result, PostgreSQL told we are alive meanwhile (`call`)."""
        while True:
            try:
                return future.result(timeout=self.capture.status_interval)
            except concurrent.futures.TimeoutError:
                if self.stop.is_set():
                    future.cancel()
                    raise Stopped() from None
                if self.cursor is not None:
                    with translate_postgres_errors("capture keepalive"):
                        self.cursor.send_feedback(force=True)

    def run(self) -> None:
        lock = repl = None
        try:
            lock = self._connect(self.name)
            self._take_lock(lock)
            repl = self._connect(self.name, replication=True)
            mark, types = self._ensure_copy(lock, repl)
            self._stream(lock, repl, mark, types)
        except Stopped:
            pass
        finally:
            self.cursor = None
            self.holding = False
            self._close(repl)
            self._close(lock)

    def _take_lock(self, lock: Any) -> None:
        while True:
            with translate_postgres_errors("capture lock"):
                (held,) = query(lock, "SELECT pg_try_advisory_lock(%s, %s)", LOCK_CLASS,
                                lock_key(self.capture.slot))[0]
            if held:
                self.holding = True
                return
            if self.stop.wait(self.capture.takeover_interval):
                raise Stopped()

    def _slot(self, lock: Any) -> Slot:
        with translate_postgres_errors("capture slot"):
            rows = query(lock, "SELECT coalesce(wal_status, '') FROM pg_replication_slots "
                         "WHERE slot_name = %s", self.capture.slot)
        return Slot(bool(rows), bool(rows) and rows[0][0] == "lost")

    def _ensure_copy(self, lock: Any, repl: Any) -> tuple[Mark, dict[str, dict[str, int]]]:
        """The mark the stream continues: the slot's, when it exists whole and the bucket holds
        its copy; else a new slot, its tables copied at its exported snapshot."""
        slot = self._slot(lock)
        mark = self.call(self.sink.mark())
        if slot.exists and not slot.lost and mark is not None:
            return mark, self._types(lock)
        reason = ("the slot was invalidated (its WAL is gone)" if slot.lost
                  else "the bucket holds no copy for the slot" if slot.exists
                  else "no slot" if mark is None else "the slot is gone")
        log.warning("capture: new slot and copy", slot=self.capture.slot, reason=reason)
        with translate_postgres_errors("capture slot creation"):
            if slot.exists:
                query(lock, "SELECT pg_drop_replication_slot(%s)", self.capture.slot)
            cur = repl.cursor()
            cur.create_replication_slot(self.capture.slot, output_plugin="pgoutput")
            _, consistent, snapshot, _ = cur.fetchone()
        lsn = po.parse_lsn(consistent)
        seen, types = self._copy(snapshot)
        return self.call(self.sink.finish_copy(seen, lsn, reason)), types

    def _copy(self, snapshot: str) -> tuple[set[tuple[str, str]], dict[str, dict[str, int]]]:
        """Copy every mapped table at `snapshot`: (resource, id) of every row, and the types
        of each table's mapped columns."""
        conn = self._connect(f"{self.name} copy")
        seen: set[tuple[str, str]] = set()
        types: dict[str, dict[str, int]] = {}
        try:
            with translate_postgres_errors("capture copy"):
                conn.autocommit = False
                conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
                query(conn, "SET TRANSACTION SNAPSHOT %s", snapshot)  # the transaction's first
                for table in self.capture.tables:
                    shape = self._shape(conn, table, types.setdefault(table.qualified, {}))
                    seen |= self._copy_table(conn, shape)
                conn.commit()
        finally:
            self._close(conn)
        return seen, types

    def _types(self, conn: Any) -> dict[str, dict[str, int]]:
        types: dict[str, dict[str, int]] = {}
        with translate_postgres_errors("capture catalog"):
            for table in self.capture.tables:
                self._shape(conn, table, types.setdefault(table.qualified, {}))
        return types

    @staticmethod
    def _shape(conn: Any, table: Table, types: dict[str, int]) -> Shape:
        """The table's shape as the catalog says (a Relation message of its columns)."""
        rows = query(conn, """
            SELECT a.attname, a.atttypid::int, coalesce(a.attnum = ANY(i.indkey), false)
            FROM pg_attribute a LEFT JOIN pg_index i
                ON i.indrelid = a.attrelid AND i.indisprimary
            WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
            ORDER BY a.attnum""", table.quoted)
        columns = tuple(po.Column(int(key), name, oid, -1) for name, oid, key in rows)
        return Shape.of(table, po.Relation(0, table.schema, table.name, ord("d"), columns), types)

    def _copy_table(self, conn: Any, shape: Shape) -> set[tuple[str, str]]:
        table = shape.table
        if shape.problem is not None:
            raise CaptureError(f"capture copy: {shape.problem}")
        columns = ", ".join(f'"{c.name}"::text' for c in shape.relation.columns)
        seen: set[tuple[str, str]] = set()
        cur = conn.cursor(name=f"copy_{table.name}"[:60])
        cur.itersize = COPY_BATCH
        cur.execute(f"SELECT {columns} FROM {table.quoted}")
        while rows := cur.fetchmany(COPY_BATCH):
            changes = []
            for row in rows:
                values = tuple(po.NULL if v is None else po.Value.text(v) for v in row)
                id = shape.id_of(values)
                if id is not None:
                    changes.append(RowChange(table, id, shape.row(values), insert=True))
            seen |= self.call(self.sink.copy_rows(changes))
        cur.close()
        return seen

    def _stream(self, lock: Any, repl: Any, mark: Mark,
                types: dict[str, dict[str, int]]) -> None:
        assembler = Assembler(self.capture)
        assembler.types = types
        cur = repl.cursor()
        with translate_postgres_errors("capture stream"):
            cur.start_replication(
                slot_name=self.capture.slot, decode=False,
                status_interval=max(1.0, self.capture.status_interval),  # psycopg2's least
                options={"proto_version": "1", "publication_names": self.capture.publication})
        self.cursor = cur
        log.info("capture: streaming", slot=self.capture.slot, publisher=self.name)
        looked = 0.0
        pending: list[Transaction] = []
        rows = 0  # of `pending`
        flight = Flight(self, cur, mark)
        try:
            while not self.stop.is_set():
                if time.monotonic() - looked >= self.capture.status_interval:
                    looked = time.monotonic()
                    self.sink.lag(self._lag(lock), flight.confirmed)
                flight.land(wait=False)
                try:  # (not a `with` each message: this loop is the capture's hottest)
                    message = cur.read_message()
                except database.ERRORS:
                    with translate_postgres_errors("capture stream"):
                        raise
                if message is None:
                    if pending and not flight.busy:  # what arrived while the bucket answered
                        flight.launch(pending)
                        pending, rows = [], 0
                        continue
                    if not (pending or flight.busy or assembler.in_transaction):
                        flight.idle(cur.wal_end)  # nothing pending: the idle slot moves on
                    select.select([repl, flight.signal], [], [],
                                  min(0.2, self.capture.status_interval))
                    flight.drain()
                    continue
                txn = assembler.feed(po.decode(message.payload))
                while assembler.reports:
                    self.sink.ddl(assembler.reports.pop(0))
                if txn is None:
                    continue
                if txn.truncated and pending:  # a TRUNCATE reads the store: what is before first
                    flight.land(wait=True)
                    flight.launch(pending)
                    pending, rows = [], 0
                pending.append(txn)
                rows += len(txn.rows)
                if txn.truncated or len(pending) >= GROUP or rows >= GROUP_ROWS:
                    flight.land(wait=True)
                    flight.launch(pending)
                    pending, rows = [], 0
        finally:
            flight.close()

    def _lag(self, lock: Any) -> int | None:
        """Bytes between the server's WAL end and the slot's confirmed position."""
        with translate_postgres_errors("capture lag"):
            rows = query(lock, "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint "
                         "FROM pg_replication_slots WHERE slot_name = %s", self.capture.slot)
        return int(rows[0][0]) if rows and rows[0][0] is not None else None


class Flight:
    """The group of complete transactions the bucket is committing while the session reads and
    decodes the next ones: one group at a time, so groups land in commit order and each group's
    stored states are read after the one before landed. The slot's confirmed position moves to
    a group's end only after the bucket acknowledged it (`land`).

    `signal` is readable once the group in flight is answered (the session selects on it and on
    the replication socket at once).
    """

    def __init__(self, session: Session, cursor: Any, mark: Mark) -> None:
        self.session = session
        self.cursor = cursor
        self.mark = mark
        self.confirmed = 0
        self.future: concurrent.futures.Future[bool] | None = None
        self.end = 0
        self.signal, self._wake = os.pipe()
        os.set_blocking(self.signal, False)

    @property
    def busy(self) -> bool:
        return self.future is not None

    def launch(self, txns: list[Transaction]) -> None:
        """Hand `txns` to the bucket (no group is in flight); returns at once."""
        assert self.future is None
        self.end = txns[-1].end_lsn
        work = [txn for txn in txns if not (txn.empty and not txn.set_aside)]
        if not work:
            self._confirm(self.end)
            return
        coroutine = self.session.sink.apply(work, self.mark)
        self.future = asyncio.run_coroutine_threadsafe(coroutine, self.session.loop)
        self.future.add_done_callback(lambda _: os.write(self._wake, b"."))

    def land(self, wait: bool) -> None:
        """The group in flight, once answered (at once when `wait`): its end confirmed."""
        future = self.future
        if future is None or not (wait or future.done()):
            return
        self.future = None
        if not self.session.wait(future):
            raise Recopy()
        self._confirm(self.end)

    def idle(self, wal_end: int) -> None:
        """Nothing pending nor in flight: confirm the server's WAL end (an idle slot)."""
        if wal_end > self.confirmed:
            self.confirmed = wal_end
            with translate_postgres_errors("capture feedback"):
                self.cursor.send_feedback(flush_lsn=wal_end)

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self.signal, 4096)

    def close(self) -> None:
        """Wait for the group in flight (a later session must not overtake it) and confirm it
        once acknowledged (less for the next session to find applied already), then free the
        signal."""
        try:
            if self.future is not None:
                with contextlib.suppress(Exception):  # the session ends anyway
                    self.land(wait=True)
        finally:
            os.close(self.signal)
            os.close(self._wake)

    def _confirm(self, end: int) -> None:
        self.confirmed = max(self.confirmed, end)
        with translate_postgres_errors("capture feedback"):  # now: less to send again
            self.cursor.send_feedback(flush_lsn=self.confirmed, force=True)
