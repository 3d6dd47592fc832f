"""The publisher's commands of the `changefeed` CLI: serve, publish, stats.

The `changefeed` group that holds them (and the listener's `snoop`) is `changefeed_cli`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import ssl
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import click
import orjson
import structlog

from changefeed.client_options import credential_options
from changefeed.credentials import Credentials, pick_token
from changefeed.errors import ChangeError, ChangefeedError, ConfigError, ReplicationTimeout
from publisher.bucket import REPLICAS_TIMEOUT, Change, open_bucket
from publisher.bucket.redis.embedded import EmbeddedRedis
from publisher.cli.seen import wait_seen_by_options
from publisher.config.logs import set_level
from publisher.config.security import check_exposure
from publisher.config.settings import Config, load_config
from publisher.server.lifecycle import Supervisor
from publisher.server.service import Service
from publisher.server.workers import PARENT_ENV, Workers, follow_parent, free_port

log = structlog.get_logger("changefeed")

config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default="config.js",
    show_default=True,
    envvar="CHANGEFEED_CONFIG",
    show_envvar=True,
    help="The config.js to read.",
)
redis_option = click.option(
    "--redis-url",
    envvar="CHANGEFEED_REDIS_URL",
    show_envvar=True,
    help="Overrides the config's bucket.redisUrl.",
)


def _load(path: Path, **overrides: Any) -> Config:
    try:
        return load_config(path).with_overrides(**overrides)
    except ChangefeedError as exc:
        raise click.ClickException(str(exc)) from None


def base_url(url: str) -> str:
    """A publisher's URL as the user typed it, `http://` put before a `host:port` without a
    scheme (as curl does)."""
    return url if "://" in url else f"http://{url}"


@contextlib.contextmanager
def bucket_redis(config: Config, *, quiet: bool = False) -> Iterator[tuple[Config, str]]:
    """The config with a Redis URL: the configured one, else an embedded server's (started and
    logged at debug level only when `quiet`)."""
    if config.bucket.redis_url is not None:
        yield config, "configured"
        return
    embedded = EmbeddedRedis(config.state_dir, quiet=quiet).start()
    try:
        yield config.with_overrides(redis_url=embedded.url), f"embedded ({embedded.source})"
    finally:
        embedded.stop()


def _event_loop_policy(loop: str) -> asyncio.AbstractEventLoopPolicy | None:
    """uvloop's policy for `--loop uvloop` (and `auto` when uvloop is installed), else None."""
    if loop == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if loop == "uvloop":
            raise click.ClickException("--loop uvloop: uvloop is not installed") from None
        return None
    policy: asyncio.AbstractEventLoopPolicy = uvloop.EventLoopPolicy()
    return policy


@click.command()
@config_option
@click.option("--host", envvar="CHANGEFEED_HOST", show_envvar=True, help="Overrides server.host.")
@click.option(
    "--port",
    type=int,
    envvar="CHANGEFEED_PORT",
    show_envvar=True,
    help="Overrides server.port (0: any free port).",
)
@click.option(
    "--loop",
    type=click.Choice(["auto", "uvloop", "asyncio"]),
    default="auto",
    show_default=True,
    envvar="CHANGEFEED_LOOP",
    show_envvar=True,
    help="Event loop: uvloop when installed (auto), or asyncio's own.",
)
@redis_option
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    envvar="CHANGEFEED_WORKERS",
    show_envvar=True,
    help="Publisher processes sharing the port (SO_REUSEPORT), supervised by this one "
    "(docs/scaling.md#workers).",
)
@click.option("--reuse-port", is_flag=True, hidden=True, help="Listen with SO_REUSEPORT.")
@click.pass_context
def serve(
    ctx: click.Context,
    config_path: Path,
    host: str | None,
    port: int | None,
    loop: str,
    redis_url: str | None,
    workers: int,
    reuse_port: bool,
) -> None:
    """Run a publisher: HTTP routes and websocket fan-out for the config's resources.

    SIGHUP reads config.js again and applies what can change while serving; SIGTERM and SIGINT
    drain and stop (docs/operations.md#signals). With --workers N, N publisher processes share
    the port, restarted when one dies; the signals go to all of them.
    """
    follow_parent()
    config = _load(config_path, host=host, port=port, redis_url=redis_url)
    try:  # before anything starts (an embedded Redis, workers): nothing left behind
        check_exposure(config.server.host, config.security)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    log_level: str | None = (ctx.find_root().obj or {}).get("log_level")
    if workers > 1:
        _serve_workers(ctx, config, config_path, workers, loop, log_level)
        return
    if log_level is None and config.log_level is not None:
        set_level(config.log_level)
    policy = _event_loop_policy(loop)
    if policy is not None:
        asyncio.set_event_loop_policy(policy)

    try:
        with bucket_redis(config) as (running, which):

            def reread() -> Config:
                """config.js again, with this command's overrides and the same Redis."""
                again = load_config(config_path).with_overrides(host, port, redis_url)
                if again.bucket.redis_url is None:
                    again = again.with_overrides(redis_url=running.bucket.redis_url)
                return again

            # A worker is handed its parent's Redis: say what that one is, not "configured".
            which = os.environ.get(REDIS_KIND_ENV, which) if os.environ.get(PARENT_ENV) else which
            asyncio.run(
                _serve(running, which, Supervisor(reread, log_level), reuse_port=reuse_port)
            )
    except ChangefeedError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot start: {exc}") from None


REDIS_KIND_ENV = "CHANGEFEED_WORKER_REDIS_KIND"
"""What the parent of `serve --workers N` says its Redis is (configured, embedded...), for the
workers' `listening` line."""

GC_THRESHOLDS = (700, 10, 100)
"""Full collections ten times rarer than Python's default (700, 10, 10). With a thousand
listeners a full collection stops the event loop for 45-75 ms on the benchmark machine, and the
default ran 15 of them in a 35 s run at 200 changes/s (docs/benchmarks-history.md, P2)."""


def _serve_workers(
    ctx: click.Context,
    config: Config,
    config_path: Path,
    count: int,
    loop: str,
    log_level: str | None,
) -> None:
    """`serve --workers N`: start the embedded Redis (if any) and pick the port once, then run
    N `serve --reuse-port` children under `publisher.server.workers.Workers`."""
    root = ctx.find_root()
    try:
        with bucket_redis(config) as (running, which):
            server = running.server
            port = server.port or free_port(server.host)
            env = dict(os.environ)
            env.pop("NOTIFY_SOCKET", None)  # systemd hears from the parent only
            env.pop("CHANGEFEED_WORKERS", None)
            env.pop(PARENT_ENV, None)  # Workers sets it to this process
            env[REDIS_KIND_ENV] = which
            env["CHANGEFEED_PORT"] = str(port)
            env["CHANGEFEED_HOST"] = server.host
            if which != "configured" or "CHANGEFEED_REDIS_URL" in os.environ or (
                ctx.params.get("redis_url") is not None
            ):
                assert running.bucket.redis_url is not None
                env["CHANGEFEED_REDIS_URL"] = running.bucket.redis_url  # not in argv (ps)
            if log_level is not None:
                env["CHANGEFEED_LOG_LEVEL"] = log_level
            format_ = root.params.get("log_format")
            if format_:
                env["CHANGEFEED_LOG_FORMAT"] = str(format_)
            command = [
                sys.executable, "-m", "changefeed_cli", "serve", "--config", str(config_path),
                "--loop", loop, "--reuse-port",
            ]
            log.info("starting workers", workers=count, host=server.host, port=port,
                     redis=running.bucket.display_url, redis_kind=which)
            code = asyncio.run(Workers(command, count, env).run())
    except ChangefeedError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot start: {exc}") from None
    ctx.exit(code)


async def _serve(
    config: Config, which: str, supervisor: Supervisor, *, reuse_port: bool = False
) -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    signals = supervisor.install(asyncio.get_running_loop())
    service = Service(config, reuse_port=reuse_port)
    await service.start()
    # What start-up built lives as long as the process: out of every later collection.
    gc.collect()
    gc.freeze()
    log.info(
        "listening",
        url=service.url,
        loop=type(asyncio.get_running_loop()).__module__.split(".")[0],
        redis=config.bucket.display_url,
        redis_kind=which,
        bucket=config.bucket.name,
        resources=[r.resource for r in config.resources],
        publisher=service.id,
    )
    await supervisor.run(service, signals)


@click.command()
@config_option
@redis_option
@click.argument("resource")
@click.argument("changed_id", metavar="ID")
@click.option("--sub", "subs", required=True, help="Comma-separated sub-resources, e.g. nic,alias.")
@click.option("--data", help="The new state, a JSON object: stored with the change.")
@click.option("--delete", is_flag=True, help="Remove the stored state with the change.")
@click.option(
    "--key",
    help="Idempotency key: if a commit with this key is already in the bucket (kept for maxAge), "
    "write nothing and print its cursor.",
)
@click.option(
    "--replicas",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Return only once this many Redis replicas have the commit (WAIT); else fail saying "
    "the commit is written on the master only.",
)
@click.option(
    "--replicas-timeout",
    type=click.FloatRange(min=0.001),
    default=REPLICAS_TIMEOUT,
    show_default=True,
    help="Seconds --replicas waits for the replicas.",
)
@wait_seen_by_options(lambda: (_credentials, _get_json))
def publish(
    config_path: Path,
    redis_url: str | None,
    resource: str,
    changed_id: str,
    subs: str,
    data: str | None,
    delete: bool,
    key: str | None,
    replicas: int,
    replicas_timeout: float,
) -> str:
    """Commit one change and print its cursor (the last line of output).

    With --data (a JSON object) the state is stored and the item appended atomically; with
    --delete the state is removed; with neither, only the change item is appended. When Redis
    did not answer a sent commit, the error says the outcome is unknown: run the same command
    again with the same --key to commit it exactly once. With --replicas, a commit the replicas
    did not confirm in time fails (exit 1) after printing its cursor: it is written on the
    master only.
    """
    if data is not None and delete:
        raise click.UsageError("--data and --delete exclude each other")
    sub_resources = [s.strip() for s in subs.split(",") if s.strip()]
    change = _change(resource, changed_id, sub_resources, data, delete)
    config = _load(config_path, redis_url=redis_url)
    try:
        with bucket_redis(config, quiet=True) as (config, _):
            assert config.bucket.redis_url is not None
            cursor = asyncio.run(
                _publish(config, change, key, replicas, replicas_timeout)
            )
    except ReplicationTimeout as exc:
        click.echo(exc.cursors[-1])
        raise click.ClickException(str(exc)) from None
    except ChangefeedError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(cursor)
    return cursor


def _change(
    resource: str, changed_id: str, subs: list[str], data: str | None, delete: bool
) -> Change:
    """The change `publish` commits: a put of `data` (a JSON object), a delete, or a publish."""
    if delete:
        return Change.delete(resource, changed_id, subs)
    if data is None:
        return Change.publish(resource, changed_id, subs)
    try:
        state = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--data") from None
    try:
        return Change.put(resource, changed_id, subs, state)
    except ChangeError as exc:
        raise click.BadParameter(str(exc), param_hint="--data") from None


async def _publish(
    config: Config,
    change: Change,
    key: str | None,
    replicas: int = 0,
    replicas_timeout: float = REPLICAS_TIMEOUT,
) -> str:
    assert config.bucket.redis_url is not None
    bucket = open_bucket(
        config.bucket.redis_url, config.bucket.name, config.resources, config.bucket.partitions
    )
    try:
        cursors = await bucket.commit_replicated(
            [change], key=key, replicas=replicas, timeout=replicas_timeout
        )
        return cursors[0]
    finally:
        await bucket.aclose()


@click.command()
@click.argument("url", envvar="CHANGEFEED_URL")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.option(
    "--fleet",
    "--cluster",
    "fleet",
    is_flag=True,
    envvar=["CHANGEFEED_STATS_FLEET", "CHANGEFEED_STATS_CLUSTER"],
    help="Every live publisher of the fleet (?scope=fleet), not only the one at URL. "
    "--cluster (CHANGEFEED_STATS_CLUSTER) is an alias.",
)
@credential_options
def stats(
    url: str, as_json: bool, fleet: bool, token_file: Path | None, cafile: Path | None
) -> None:
    """Print a publisher's /changefeeds/stats readably (URL: the publisher's base URL;
    `host:port` alone means http://host:port).

    Registrations and addresses are shown to a token with the `stats` scope; counts to others.
    """
    credentials = _credentials(token_file, cafile)
    url = base_url(url)
    stats_url = url.rstrip("/") + "/changefeeds/stats" + ("?scope=fleet" if fleet else "")
    try:
        body = asyncio.run(_get_json(stats_url, credentials, url))
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise click.ClickException(f"cannot read stats from {url}: {exc}") from None
    if as_json:
        click.echo(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode())
        return
    if fleet:
        publishers = body["publishers"]
        click.echo(f"{len(publishers)} publisher(s), {body['listeners']} listener(s)")
        _table(
            [("PUBLISHER", "HOST", "URL", "LISTENERS", "READY", "BEHIND", "LAST SEEN")]
            + [
                (
                    p["publisher"],
                    str(p.get("host", "")),
                    str(p.get("url", "")),
                    str(p.get("listeners", 0)),
                    "draining" if p.get("draining") else ("yes" if p.get("ready") else "no"),
                    str(p.get("tail", {}).get("itemsBehind", "")),
                    f"{p.get('lastSeen', 0):.1f}s ago",
                )
                for p in publishers
            ]
        )
        click.echo("")
    else:
        click.echo(f"publisher {body.get('publisher', '?')}: {body['listeners']} listener(s)")
    if "registrations" not in body:
        click.echo("(registrations not shown: the token lacks the stats scope)")
        return
    rows: list[tuple[str, ...]] = [
        ("INSTANCE", "SERVICE", "RESOURCE", "SUB-RESOURCES", "SINCE", "BEHIND", "LAST CURSOR")
    ]
    if fleet:
        rows[0] = ("PUBLISHER", *rows[0])
    for reg in body["registrations"]:
        kind = reg["changeKind"]
        row: tuple[str, ...] = (
            reg["instance"],
            reg["service"],
            kind["resource"],
            ",".join(kind["subResources"]),
            reg.get("connectedSince", ""),
            str(reg.get("itemsBehindHead", "")),
            reg.get("lastCursorSent") or "-",
        )
        rows.append((reg.get("publisher", ""), *row) if fleet else row)
    _table(rows)


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


def _credentials(token_file: Path | None, cafile: Path | None) -> Credentials:
    """The token of --token-file, else CHANGEFEED_TOKEN; a context trusting --cafile."""
    try:
        text = None if token_file is None else token_file.read_text()
        token = pick_token(None, text, os.environ)
        context = None if cafile is None else ssl.create_default_context(cafile=str(cafile))
    except (OSError, UnicodeDecodeError, ValueError, ssl.SSLError) as exc:
        raise click.ClickException(f"credentials: {exc}") from None
    return Credentials(token, context)


async def _get_json(url: str, credentials: Credentials, base: str) -> Any:
    timeout = aiohttp.ClientTimeout(total=10)
    connector = aiohttp.TCPConnector(ssl=credentials.ssl or True)
    headers = credentials.headers_for(url, base)
    async with (
        aiohttp.ClientSession(timeout=timeout, connector=connector) as session,
        session.get(url, headers=headers) as response,
    ):
        if response.status != 200:
            raise ValueError(f"HTTP {response.status}: {await response.text()}")
        return await response.json()


__all__ = ["publish", "serve", "stats"]
