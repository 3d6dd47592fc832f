"""`changefeed capture install | status`: the capture of config.js's `capture` key
(docs/capture.md). The capture's modules (and psycopg2, the postgres extra's) are imported by
the commands, not here: the command line starts without the extra."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click
import orjson

from changefeed.errors import ChangefeedError
from publisher.bucket import open_bucket
from publisher.cli.commands import _load, config_option, redis_option
from publisher.config.capture import Capture
from publisher.config.settings import Config


def _capture(config: Config) -> Capture:
    if config.capture is None:
        raise click.ClickException("config.js has no `capture` key (docs/capture.md)")
    return config.capture


def _connect(capture: Capture) -> Any:
    from publisher.capture import database

    try:
        return database.connect(capture.url(), "cli")
    except ChangefeedError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
def capture() -> None:
    """The capture of PostgreSQL tables by logical replication (config.js `capture`)."""


@capture.command()
@config_option
def install(config_path: Path) -> None:
    """Check the server's settings (each wrong one named with its fix), then create the
    publication of the mapped tables. Exit 1 when a setting is wrong."""
    from publisher.capture.install import check
    from publisher.capture.install import install as publish

    settings = _capture(_load(config_path))
    conn = _connect(settings)
    try:
        findings = check(conn, settings)
        for finding in findings:
            click.echo(f"wrong: {finding}", err=True)
        if findings:
            raise click.ClickException(f"{len(findings)} setting(s) to mend first")
        click.echo(publish(conn, settings))
        click.echo(f"ready: the publisher creates slot {settings.slot} at its first start")
    except ChangefeedError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        conn.close()


@capture.command()
@config_option
@redis_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(config_path: Path, redis_url: str | None, as_json: bool) -> None:
    """The slot, its lag, the streaming publisher, the copy and the rows set aside."""
    from publisher.bucket.stores.capture_marks import CaptureMarks
    from publisher.capture.status import read_status

    config = _load(config_path, redis_url=redis_url)
    settings = _capture(config)
    conn = _connect(settings)
    try:
        found = read_status(conn, settings.slot)
    except ChangefeedError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        conn.close()
    if config.bucket.redis_url is not None:

        async def bucket_part() -> None:
            assert config.bucket.redis_url is not None
            bucket = open_bucket(config.bucket.redis_url, config.bucket.name)
            try:
                marks = CaptureMarks(bucket.redis, bucket.name)
                mark = await marks.read(settings.slot)
                copied = None if mark is None else {
                    "epoch": mark.epoch, "lsn": mark.lsn, "at": mark.at}
                found.held(copied, [orjson.loads(row) for row in await marks.aside(settings.slot)])
            finally:
                await bucket.aclose()

        try:
            asyncio.run(bucket_part())
        except ChangefeedError as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(orjson.dumps(found.report()).decode())
        return
    lag = "unknown" if found.lag_bytes is None else f"{found.lag_bytes} byte(s)"
    if found.lag_seconds is not None:
        lag += f", {found.lag_seconds:.3f} s"
    click.echo(f"slot:      {found.slot} " + (
        f"({'active' if found.active else 'inactive'}, WAL {found.wal_status})"
        if found.exists else "(missing: the publisher creates it)"))
    click.echo(f"lag:       {lag}")
    click.echo(f"streaming: {found.streaming or 'no publisher'}")
    click.echo(f"set aside: {len(found.set_aside)} row(s)")
    for row in found.set_aside[:10]:
        click.echo(f"  {row['table']} {row['id']}: {row['reason']} (at {row['lsn']})")
