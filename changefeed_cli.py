"""The `changefeed` command: one click group over the publisher's commands (serve, publish,
stats, trace, outbox, capture), the listener's (snoop) and the testing kit's (conformance).

With the testing kit, the only code that imports both sides; `python -m changefeed_cli` runs it
too. Every option can also be set by an environment variable: `CHANGEFEED_<OPTION>` for the
group's and the shared ones (`CHANGEFEED_LOG_LEVEL`, `CHANGEFEED_CONFIG`, `CHANGEFEED_PORT`...),
else `CHANGEFEED_<COMMAND>_<OPTION>`; `--help` shows each one's name.
"""

from __future__ import annotations

import sys

import click

from changefeed_testing.conformance.cli import conformance
from listener.snoop import snoop
from publisher.cli.capture import capture
from publisher.cli.commands import publish, serve, stats
from publisher.cli.outbox import outbox
from publisher.cli.trace import trace
from publisher.config.logs import configure
from publisher.config.settings import LOG_LEVELS


@click.group(
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "CHANGEFEED"},
)
@click.version_option(package_name="changefeed", prog_name="changefeed")
@click.option(
    "--log-format",
    type=click.Choice(["auto", "json", "console"]),
    default="auto",
    show_default=True,
    envvar="CHANGEFEED_LOG_FORMAT",
    show_envvar=True,
    help="JSON lines (default when not on a terminal) or readable lines.",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    envvar="CHANGEFEED_LOG_LEVEL",
    show_envvar=True,
    help="Least level logged [default: config.js's logLevel, else info].",
)
@click.pass_context
def main(ctx: click.Context, log_format: str, log_level: str | None) -> None:
    """Change feeds on Redis (RFD 5): publish changes and serve them to listeners."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())
        ctx.exit(0)
    ctx.obj = {"log_level": log_level.lower() if log_level else None}
    configure(
        json=None if log_format == "auto" else log_format == "json",
        level=log_level.lower() if log_level else "info",
    )


for command in (serve, publish, stats, trace, outbox, capture, snoop, conformance):
    main.add_command(command)


if __name__ == "__main__":
    sys.exit(main())
