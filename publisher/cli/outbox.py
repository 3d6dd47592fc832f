"""`changefeed outbox install | status | resync | cursor`: the PostgreSQL outbox of config.js's
`outbox` (docs/postgres.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import orjson

from changefeed.cursor import ZERO, StreamId
from changefeed.errors import ChangefeedError
from publisher.bucket import open_bucket
from publisher.cli.commands import (
    _credentials,
    _get_json,
    _load,
    bucket_redis,
    config_option,
    redis_option,
)
from publisher.cli.seen import wait_seen_by_options
from publisher.config.outbox import Outbox
from publisher.config.settings import Config
from publisher.outbox import database
from publisher.outbox.schema import install as install_schema
from publisher.outbox.seed import resync as resync_store
from publisher.outbox.status import read_status
from publisher.outbox.writer import cursor as row_cursor

T = TypeVar("T")


def _outbox(config: Config) -> Outbox:
    if config.outbox is None:
        raise click.ClickException("config.js has no `outbox` key (docs/postgres.md)")
    return config.outbox


def _run(config: Config, work: Callable[[Any, Outbox], Awaitable[T]]) -> T:
    """Run `work(conn, outbox)` on a connection to the outbox's PostgreSQL; our errors (never
    showing the URL's password) become the command's."""
    outbox = _outbox(config)

    async def run() -> T:
        conn = await database.connect(outbox.url(), "cli")
        try:
            return await work(conn, outbox)
        finally:
            await database.close(conn)

    try:
        return asyncio.run(run())
    except ChangefeedError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
def outbox() -> None:
    """The PostgreSQL outbox the publisher relays (config.js `outbox`)."""


@outbox.command()
@config_option
def install(config_path: Path) -> None:
    """Create the changefeed schema (or migrate it to this release's version): idempotent,
    in one transaction."""
    done = _run(_load(config_path), lambda conn, _: install_schema(conn))
    if done.before == done.after:
        click.echo(f"outbox schema at version {done.after}: up to date")
    else:
        click.echo(f"outbox schema installed: version {done.before} -> {done.after}")


@outbox.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(config_path: Path, as_json: bool) -> None:
    """The backlog, the oldest row's age, the relaying publisher and the dead rows."""
    found = _run(_load(config_path), lambda conn, _: read_status(conn))
    report = found.report()
    if as_json:
        click.echo(orjson.dumps(report).decode())
        return
    age = found.oldest_age
    click.echo(f"backlog:   {found.backlog} row(s)"
               + (f", the oldest {age:.3f} s old" if age is not None else ""))
    click.echo(f"relaying:  {found.relaying or 'no publisher'}")
    click.echo(f"dead rows: {found.dead} (changefeed.outbox_dead)")
    click.echo(f"schema:    version {found.version}")


@outbox.command()
@config_option
@redis_option
@click.option("--resource", help="Only this resource (default: every one).")
def resync(config_path: Path, redis_url: str | None, resource: str | None) -> None:
    """Re-seed the bucket's store from the snapshot queries and give every listener one
    Resync: by the relaying publisher if one runs, else here."""
    config = _load(config_path, redis_url=redis_url)
    if resource is not None and resource not in config.resource_map:
        raise click.BadParameter(
            f"not a configured resource: {resource!r}", param_hint="--resource"
        )
    if config.bucket.redis_url is None:
        raise click.ClickException(
            "resync needs the bucket's Redis: bucket.redisUrl or --redis-url"
        )

    async def work(conn: Any, outbox: Outbox) -> str | None:
        assert config.bucket.redis_url is not None
        bucket = open_bucket(config.bucket.redis_url, config.bucket.name, config.resources,
                             config.bucket.partitions)
        try:
            return await resync_store(conn, bucket, outbox, config.resource_map, resource)
        finally:
            await bucket.aclose()

    asked = _run(config, work)
    click.echo(f"asked {asked} to re-seed" if asked else "re-seeded; listeners resync")


@outbox.command()
@config_option
@click.argument("row", type=int)
@click.argument("resource")
@click.argument("changed_id", metavar="ID")
@click.option("--sub", "subs", required=True, help="Its comma-separated sub-resources.")
@click.option("--timeout", type=float, default=10.0, show_default=True,
              help="Seconds to wait for the relay.")
@wait_seen_by_options(lambda: (_credentials, _get_json))
def cursor(config_path: Path, row: int, resource: str, changed_id: str, subs: str,
           timeout: float) -> str:
    """Wait until outbox row ROW (the change of RESOURCE ID that changefeed.put/delete/publish
    returned) is in the bucket and print its cursor; with --wait-seen-by, then wait until
    listeners were sent it. Exit 1 when the row is dead or not relayed in time, or is the
    change of another resource or id."""
    config = _load(config_path)
    said = (resource, changed_id)
    checked: list[bool] = []

    async def work(conn: Any, _: Outbox) -> str:
        found = await conn.fetchrow(_ROW, row)
        if found is not None:  # not relayed yet, or dead
            _check_row(row, said, (found["resource"], found["changed_id"]))
            checked.append(True)
        return await row_cursor(conn, row, timeout=timeout)

    found = _run(config, work)
    if not checked:  # relayed already: the bucket's log says whose change it is
        with bucket_redis(config, quiet=True) as (running, _):
            assert running.bucket.redis_url is not None
            logged = asyncio.run(_logged(running, found))
        if logged is not None:
            _check_row(row, said, logged)
    click.echo(found)
    return found


_ROW = """
SELECT resource, changed_id FROM changefeed.outbox WHERE id = $1
UNION ALL SELECT resource, changed_id FROM changefeed.outbox_dead WHERE id = $1
"""


def _check_row(row: int, said: tuple[str, str], found: tuple[str, str]) -> None:
    if said != found:
        raise click.ClickException(
            f"outbox row {row} is the change of {found[0]} {found[1]!r}, not of "
            f"{said[0]} {said[1]!r} (RESOURCE and ID name the row's own change)"
        )


async def _logged(config: Config, cursor: str) -> tuple[str, str] | None:
    """(resource, id) of the change at `cursor` in the bucket's log (None: trimmed since)."""
    assert config.bucket.redis_url is not None
    bucket = open_bucket(config.bucket.redis_url, config.bucket.name, config.resources,
                         config.bucket.partitions)
    try:
        vector = await bucket.log.decode_cursor(cursor)
        own = [(s, at) for s, at in enumerate(vector.positions) if at != ZERO]
        if len(own) != 1:
            return None
        shard, at = (await bucket.log.shards())[own[0][0]], own[0][1]
        before = StreamId(at.ms, at.seq - 1) if at.seq else StreamId(at.ms - 1, 2**64 - 1)
        entries = await shard.read(before, at, 1)
    finally:
        await bucket.aclose()
    return (entries[0].resource, entries[0].changed_resource_id) if entries else None
