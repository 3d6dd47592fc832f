"""`changefeed conformance URL`: run the RFD 5 protocol checks against a publisher and print a
report. Exits 0 when no check failed, 1 when one did (or, with --strict, could not run)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from changefeed_testing.conformance.changes import BucketChanges, ChangeMaker, CommandChanges
from changefeed_testing.conformance.outcome import Status
from changefeed_testing.conformance.report import as_json, text
from changefeed_testing.conformance.run import Report, checks, run_checks
from changefeed_testing.conformance.target import Target


async def conform(target: Target, only: tuple[str, ...]) -> Report:
    """Run the checks, then close the change maker."""
    try:
        return await run_checks(target, only)
    finally:
        if target.changes is not None:
            await target.changes.aclose()


@contextlib.contextmanager
def bucket_url(config: Path, redis_url: str | None) -> Iterator[str]:
    """The Redis URL of the config's bucket: --redis-url, the config's, or its embedded Redis
    (found running, or started for the run, as `changefeed publish` does)."""
    from changefeed.errors import ChangefeedError
    from publisher.cli.commands import bucket_redis
    from publisher.config.settings import load_config

    try:
        loaded = load_config(config).with_overrides(redis_url=redis_url)
    except ChangefeedError as exc:
        raise click.ClickException(str(exc)) from None
    with bucket_redis(loaded) as (with_redis, _):
        assert with_redis.bucket.redis_url is not None
        yield with_redis.bucket.redis_url


@click.command()
@click.argument("url", required=False)
@click.option("--resource", default="vm", show_default=True,
              help="The resource the checks register for.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="The publisher's config.js: the item and resume checks write probe changes "
                   "into its live bucket (change items of ids conformance-<run>-<n>, no state; "
                   "listeners of the resource receive them), named in the report.")
@click.option("--redis-url", help="With --config: overrides its bucket.redisUrl.")
@click.option("--publish-command", metavar="CMD",
              help="A shell command that causes one change: {resource}, {id} and {sub} are "
                   "replaced; its last output line may be the cursor.")
@click.option("--timeout", type=float, default=5.0, show_default=True,
              help="Seconds to wait for any one answer.")
@click.option("--wait", type=float, default=5.0, show_default=True,
              help="Without --config or --publish-command: seconds to wait for an item to "
                   "arrive by itself.")
@click.option("--check", "only", multiple=True, metavar="NAME",
              help="Run only this check (repeatable; `resources` always runs).")
@click.option("--strict", is_flag=True, help="Checks that could not run fail the run too.")
@click.option("--json", "json_output", is_flag=True, help="Print the report as JSON.")
@click.option("--list", "list_checks", is_flag=True, help="List the checks and exit.")
def conformance(
    url: str | None, resource: str, config_path: Path | None, redis_url: str | None,
    publish_command: str | None, timeout: float, wait: float, only: tuple[str, ...],
    strict: bool, json_output: bool, list_checks: bool,
) -> None:
    """Check that the publisher at URL speaks the RFD 5 change-feed protocol as
    docs/protocol.md describes it: registration v1/v2, bad registrations and their close codes,
    the shape and order of items, resuming with `since`.

    Item and resume checks need a way to cause changes: --config (they write probe changes
    into the live bucket, named in the report) or --publish-command; without, they say they
    could not run.
    """
    if list_checks:
        for check in checks():
            click.echo(f"{check.group:<18} {check.name:<28} {check.what}")
        return
    if url is None:
        raise click.UsageError("missing the publisher's URL")
    if config_path is not None and publish_command is not None:
        raise click.UsageError("--config and --publish-command exclude each other")
    unknown = set(only) - {c.name for c in checks()}
    if unknown:
        raise click.UsageError(f"unknown check(s): {', '.join(sorted(unknown))} (see --list)")
    with contextlib.ExitStack() as stack:
        changes: ChangeMaker | None = None
        if config_path is not None:
            changes = BucketChanges.from_config(
                config_path, stack.enter_context(bucket_url(config_path, redis_url))
            )
        elif publish_command is not None:
            changes = CommandChanges(publish_command, timeout)
        target = Target(url, resource, timeout=timeout, wait=wait, changes=changes)
        report = asyncio.run(conform(target, only))
    click.echo(as_json(report) if json_output else text(report))
    failed = not report.passed or (strict and report.count(Status.NOT_RUN) > 0)
    sys.exit(1 if failed else 0)
