"""The PostgreSQL paths into the bucket, side by side in one run (docs/postgres.md#sizing,
docs/capture.md#measured):

    outbox   PostgreSQL COMMIT of a transaction calling changefeed.put -> listener receive
             (the relay woken by LISTEN commits it to the bucket; the publisher fans it out)
    capture  PostgreSQL COMMIT of a plain INSERT into a captured table -> listener receive
             (the same publisher's capture reads it from the slot and commits it)
    direct   ChangeBucket.commit -> listener receive, same publisher, same listeners
    notify   a bare INSERT + NOTIFY -> LISTEN round trip (one LISTEN session, in this process)

at `--rate` changes a second to `--listeners` websocket listeners (client worker processes,
bench.clients; a tenth of them time each item from the stamp in its id, bench.items); then the
relay's throughput: `--rows` outbox rows committed in transactions of 1,000, timed from the
first COMMIT until the outbox is empty.

    python -m bench.studies.outbox                             # 200/s, 100 listeners, 20 s each
    python -m bench.studies.outbox --rate 50 --duration 3 --rows 20000  # a small run

Every server is private and started here: redis-server, PostgreSQL (initdb, `wal_level =
logical`), one publisher with both the outbox and the capture of one table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from bench import items
from bench.clients import ClientPool, WorkerSpec
from bench.drive import pace
from bench.histogram import Histogram
from bench.scenario import LAZY, listeners
from changefeed_testing.postgres import PostgresServer
from changefeed_testing.servers import PublisherProcess, RedisServer, write_config
from publisher.bucket import ChangeBucket, connect
from publisher.capture import database
from publisher.capture import install as capture_install
from publisher.config.capture import parse_capture
from publisher.config.settings import load_config
from publisher.outbox.schema import install

CAPTURED = "CREATE TABLE vms (uuid text PRIMARY KEY, nics jsonb NOT NULL)"
CAPTURE = {"tables": {"public.vms": {"resource": "vm", "id": "uuid",
                                     "subResources": {"nic": ["nics"]}}}}
"""The captured table: an insert is a put of `vm` announcing `nic`, the listeners' change kind."""

STATE = '{"uuid": "bench"}'


def summary(histogram: Histogram) -> dict[str, float]:
    return {"p50_ms": histogram.percentile(50), "p99_ms": histogram.percentile(99),
            "max_ms": histogram.max_us / 1000, "samples": histogram.count}


async def timed(pool: ClientPool, send: Any, args: argparse.Namespace) -> dict[str, float]:
    """Send stamped changes at the run's rate; the listeners' latency histogram."""
    origin = args.origin

    async def stamped(due: int) -> None:
        await send(items.stamp(due, origin))

    await pace(stamped, rate=args.rate, warmup=args.warmup, duration=args.duration,
               on_mark=pool.mark)
    await asyncio.sleep(0.5)  # the last items in flight
    return summary(pool.report().histogram)


async def notify_round_trip(url: str, args: argparse.Namespace) -> dict[str, float]:
    """INSERT + NOTIFY in one transaction -> a LISTEN session's callback."""
    histogram = Histogram()
    marked = [False]
    writer, listener = await asyncpg.connect(url), await asyncpg.connect(url)
    await writer.execute("CREATE TABLE IF NOT EXISTS bench_notify (id text, body jsonb)")

    def received(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if marked[0]:
            histogram.add(items.age_us(payload.encode(), time.monotonic_ns(), args.origin))

    await listener.add_listener("bench", received)

    async def send(due: int) -> None:
        stamp = items.stamp(due, args.origin)
        async with writer.transaction():
            await writer.execute("INSERT INTO bench_notify VALUES ($1, $2::jsonb)", stamp, STATE)
            await writer.execute("SELECT pg_notify('bench', $1)", stamp)

    await pace(send, rate=args.rate, warmup=args.warmup, duration=args.duration,
               on_mark=lambda: marked.__setitem__(0, True))
    await asyncio.sleep(0.5)
    await writer.close()
    await listener.close()
    return summary(histogram)


async def throughput(url: str, rows: int) -> dict[str, float]:
    """`rows` outbox rows in transactions of 1,000 (committed as fast as PostgreSQL takes them),
    timed until the relay has emptied the outbox."""
    conn = await asyncpg.connect(url)
    started = time.monotonic()
    for start in range(0, rows, 1000):
        await conn.execute(
            "SELECT changefeed.put('vm', 'r' || g, '{nic}', $2::jsonb) "
            "FROM generate_series($1::int, $1::int + 999) g", start, STATE)
    written = time.monotonic() - started
    while True:  # no event says "empty": look every 10 ms
        if not await conn.fetchval("SELECT count(*) FROM changefeed.outbox"):
            break
        await asyncio.sleep(0.01)
    seconds = time.monotonic() - started
    await conn.close()
    return {"rows": rows, "seconds": round(seconds, 3), "rows_per_s": round(rows / seconds),
            "insert_seconds": round(written, 3)}


def install_capture(url: str, directory: Path) -> dict[str, Any]:
    """The captured table and its publication; config.js's `capture` section."""
    section = {"postgres": url, "slot": "bench", "publication": "bench", **CAPTURE}
    capture = parse_capture({"capture": section}, {"vm": ["nic"]}, "changefeed", directory)
    assert capture is not None
    conn = database.connect(url)
    try:
        database.query(conn, CAPTURED)
        capture_install.install(conn, capture)
    finally:
        conn.close()
    return section


async def streaming(url: str, bucket: ChangeBucket) -> None:
    """Until the publisher's capture streams, its first copy done, and its tail has read the
    epoch that copy began (a listener registered before would be told to start again)."""
    async with aiohttp.ClientSession() as http:
        for _ in range(600):
            async with http.get(url + "/changefeeds/stats") as reply:
                stats = await reply.json()
            position = stats["tail"]["position"] or ""
            capture = stats.get("capture", {})
            if (capture.get("streaming") and capture.get("copies")
                    and position.startswith(f"{await bucket.log.current_epoch()}.")):
                return
            await asyncio.sleep(0.05)
    raise TimeoutError("the capture did not start streaming")


async def run(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    redis = RedisServer(directory / "redis", persist=False).start()
    postgres = PostgresServer({"wal_level": "logical"}).start()
    publisher: PublisherProcess | None = None
    try:
        admin = await asyncpg.connect(postgres.url())
        await admin.execute("CREATE DATABASE bench")
        await admin.close()
        url = postgres.url("bench")
        conn = await asyncpg.connect(url)
        await install(conn)
        capture = install_capture(url, directory)
        config_path = write_config(directory / "config.js", redis.url,
                                   outbox={"postgres": url, "batch": 1000}, capture=capture,
                                   server={"host": "127.0.0.1", "port": 0,
                                           "maxConnectionsPerClient": 10000})
        publisher = PublisherProcess(config_path).start()
        config = load_config(config_path)
        bucket = ChangeBucket(connect(redis.url), config.bucket.name, config.resources)
        await streaming(publisher.url, bucket)
        port = int(publisher.url.rsplit(":", 1)[1])
        regs = listeners(args.listeners)
        probes = max(1, args.listeners // 10)
        args.origin = time.monotonic_ns()
        specs = [WorkerSpec("ws", "127.0.0.1", port, tuple(regs[:probes]), latency=True,
                            origin_ns=args.origin)]
        if args.listeners > probes:
            specs.append(WorkerSpec("ws", "127.0.0.1", port, tuple(regs[probes:]),
                                    interval=LAZY))
        results: dict[str, Any] = {"rate": args.rate, "listeners": args.listeners,
                                   "duration": args.duration}
        with ClientPool(specs) as pool:
            pool.ready()

            async def via_outbox(stamp: str) -> None:
                async with conn.transaction():
                    await conn.execute(
                        "SELECT changefeed.put('vm', $1, '{nic}', $2::jsonb)", stamp, STATE)

            async def via_capture(stamp: str) -> None:
                await conn.execute("INSERT INTO vms VALUES ($1, '[]')", stamp)

            async def direct(stamp: str) -> None:
                await bucket.commit("vm", stamp, ["nic"], {"uuid": "bench"})

            results["outbox"] = await timed(pool, via_outbox, args)
            results["capture"] = await timed(pool, via_capture, args)
            results["direct"] = await timed(pool, direct, args)
        results["notify"] = await notify_round_trip(url, args)
        results["throughput"] = await throughput(url, args.rows)
        await bucket.aclose()
        await conn.close()
        return results
    finally:
        if publisher is not None:
            publisher.stop()
        postgres.remove()
        redis.stop()


def table(results: dict[str, Any]) -> str:
    lines = [f"{results['rate']:g} changes/s, {results['listeners']} listeners, "
             f"{results['duration']:g} s each", "",
             "| path | p50 ms | p99 ms | max ms | samples |", "|---|---:|---:|---:|---:|"]
    for key, what in (("outbox", "PostgreSQL COMMIT -> listener (outbox)"),
                      ("capture", "PostgreSQL COMMIT -> listener (capture)"),
                      ("direct", "ChangeBucket.commit -> listener"),
                      ("notify", "INSERT + NOTIFY -> LISTEN")):
        r = results[key]
        lines.append(f"| {what} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['max_ms']:.2f} "
                     f"| {r['samples']} |")
    t = results["throughput"]
    lines += ["", f"relay throughput: {t['rows']} rows in {t['seconds']} s = "
              f"{t['rows_per_s']} rows/s (inserted in {t['insert_seconds']} s)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.outbox",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--listeners", type=int, default=100)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-outbox-") as directory:
        results = asyncio.run(run(args, Path(directory)))
    print(table(results))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
