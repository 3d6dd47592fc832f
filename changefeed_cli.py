"""The `changefeed` command: one click group over the publisher's commands (serve, publish,
stats), the listener's (snoop) and the testing kit's (conformance).

The only module besides the testing kit that imports both sides; `python -m changefeed_cli`
runs it too.
"""

from __future__ import annotations

import sys

import click

from changefeed_testing.conformance.cli import conformance
from listener.snoop import snoop
from publisher.cli import publish, serve, stats
from publisher.logs import configure


@click.group()
@click.option(
    "--log-format",
    type=click.Choice(["auto", "json", "console"]),
    default="auto",
    help="JSON lines (default when not on a terminal) or readable lines.",
)
@click.option("--log-level", default="info", show_default=True)
def main(log_format: str, log_level: str) -> None:
    """Change feeds on Redis (RFD 5): publish changes and serve them to listeners."""
    configure(json=None if log_format == "auto" else log_format == "json", level=log_level)


for command in (serve, publish, stats, snoop, conformance):
    main.add_command(command)


if __name__ == "__main__":
    sys.exit(main())
