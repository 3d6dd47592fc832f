"""The nemesis' PostgreSQL outbox (docs/postgres.md): a private PostgreSQL with the outbox
installed and the outbox writer's table, the proxy the relays reach it through, where the relay
is now, and the faults of PostgreSQL and of the link to it.

- PostgreSQL: changefeed_testing.postgres, as tests/publisher/outbox uses it; database `nemesis`,
  the outbox installed by `publisher.outbox.schema.install` (what `changefeed outbox install` runs).
- Two publishers relay (config.js `outbox`, `RELAYS`): one at a time holds the relay lock, the
  other takes over when it dies. Both reach PostgreSQL through one TCP proxy (`link`), so the
  `relay_partition` fault cuts the relays from it while the writer, which connects directly,
  commits on: the rows wait in the outbox.
- No snapshot query (`outbox.resources`): the resource `vm` is shared with the writers that
  commit to the bucket directly, and a re-seed from a table of the outbox writer's ids would
  delete theirs from the store. A bucket that lost its state is announced by its new epoch as
  for every writer; the re-seed has its own scenario (faults/outbox_faults.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg

from changefeed_testing.postgres import PostgresServer
from changefeed_testing.proxy import Proxy
from changefeed_testing.servers import PublisherProcess, scaled
from publisher.outbox.database import ERRORS
from publisher.outbox.schema import install
from publisher.outbox.status import Status, read_status

DATABASE = "nemesis"
RELAYS = (1, 2)
"""The publishers whose config.js has `outbox` (publisher 2 reaches Redis through the
`partition` proxy: a relay may be cut from Redis too)."""
WRITES = """
CREATE TABLE nemesis_writes (
    writer text NOT NULL,
    seq bigint NOT NULL,
    id text NOT NULL,
    row_id bigint NOT NULL,
    PRIMARY KEY (writer, seq)
)"""
"""The outbox writer's own table: one row per committed change, beside its outbox row. Its key
makes a retried transaction idempotent: a seq whose COMMIT had an unknown outcome and did commit
cannot commit again, and its outbox row id is found here."""
LOOK_TIMEOUT = 2.0
"""Seconds a look at the outbox's status may take (PostgreSQL may be paused)."""


class OutboxSystem:
    """The outbox's side of the system: `start()` inside the system's exit stack."""

    def __init__(self) -> None:
        self.server: PostgresServer | None = None
        self.link: Proxy | None = None
        self.logs: list[str] = []
        """The server's output of every life before the current one (a kill restarts it)."""

    async def start(self, stack: contextlib.AsyncExitStack, listen: str = "127.0.0.1") -> None:
        """Start PostgreSQL, create the database and install the outbox; the relays' proxy
        listens on `listen` (all addresses, "0.0.0.0", when a relay runs in a network
        namespace)."""
        server = self.server = PostgresServer()
        await asyncio.to_thread(server.start)
        stack.callback(server.remove)
        stack.callback(self.resume)  # a paused cluster cannot stop
        conn = await asyncpg.connect(server.url())
        try:
            await conn.execute(f"CREATE DATABASE {DATABASE}")
        finally:
            await conn.close()
        conn = await asyncpg.connect(self.url)
        try:
            await install(conn)
            await conn.execute(WRITES)
        finally:
            await conn.close()
        self.link = await stack.enter_async_context(Proxy("127.0.0.1", server.port, listen=listen))

    @property
    def url(self) -> str:
        """The outbox's database, directly (the writer's way)."""
        assert self.server is not None
        return self.server.url(DATABASE)

    def relay_url(self, host: str = "127.0.0.1") -> str:
        """The outbox's database through the proxy (the relays' way), at `host`."""
        assert self.link is not None
        return f"postgresql://postgres@{host}:{self.link.port}/{DATABASE}"

    def config(self, host: str = "127.0.0.1") -> dict[str, Any]:
        """config.js's `outbox` of a relaying publisher (that reaches the proxy at `host`): a
        quick poll and takeover, and the relayed rows' cursors kept for an hour (a soak's
        writer learns them late)."""
        return {"postgres": self.relay_url(host), "pollInterval": 0.5, "takeoverInterval": 0.5,
                "keepRelayed": 3600}

    def output(self) -> str:
        return "".join(self.logs) + (self.server.output() if self.server is not None else "")

    # --- looks -------------------------------------------------------------------------------

    async def status(self) -> Status | None:
        """The outbox's status (None: PostgreSQL did not answer within LOOK_TIMEOUT)."""
        try:
            async with asyncio.timeout(scaled(LOOK_TIMEOUT)):
                conn = await asyncpg.connect(self.url)
                try:
                    return await read_status(conn)
                finally:
                    await conn.close()
        except ERRORS:
            return None

    async def relaying(self, publishers: Sequence[PublisherProcess],
                       within: float) -> int | None:
        """The index of the publisher holding the relay lock (its session is named after its
        pid: `changefeed-relay <host>-<pid>-<tag>`), waiting up to `within` seconds for one;
        None when none does."""
        deadline = time.monotonic() + scaled(within)
        while True:
            status = await self.status()
            session = (status.relaying if status is not None else None) or ""
            for n in RELAYS:
                process = publishers[n].process
                if process is not None and f"-{process.pid}-" in session:
                    return n
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.1)  # the lock changes hands by the relays' own timers

    # --- faults ------------------------------------------------------------------------------

    def inject(self, kind: str) -> None:
        assert self.server is not None and self.link is not None
        if kind == "postgres_kill":
            self.server.kill()  # the postmaster: its backends exit when they see it gone
        elif kind == "postgres_stop":
            self._signal(signal.SIGSTOP)
        elif kind == "relay_partition":
            self.link.blackhole()
        else:
            raise ValueError(kind)

    async def heal(self, kind: str) -> None:
        assert self.server is not None and self.link is not None
        if kind == "postgres_kill":
            self.logs.append(self.server.output())
            await asyncio.to_thread(self.server.start)  # crash recovery, same port and data
        elif kind == "postgres_stop":
            self.resume()
        elif kind == "relay_partition":
            self.link.pass_through()
        else:
            raise ValueError(kind)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, number: signal.Signals) -> None:
        """Send `number` to every process of the cluster: the postmaster first (it forks no
        backend once stopped), then its children (backends, background workers). Not to its
        process group: every child of the postmaster makes itself a group leader (setsid)."""
        process = self.server.process if self.server is not None else None
        if process is None or process.poll() is not None:
            return
        for pid in [process.pid, *children(process.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, number)


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux's /proc: `pid (comm) state ppid ...`)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


__all__ = ["DATABASE", "RELAYS", "OutboxSystem", "children"]
