"""The command-line options of every command that talks to a publisher as its client
(`changefeed snoop`, `changefeed stats`): the token file and the CA bundle. What they mean is
changefeed/credentials.py's (`pick_token`); each command reads them into its `Credentials`
(snoop through the listener's client options, listener/options.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

Command = TypeVar("Command", bound=Callable[..., object])


def credential_options(command: Command) -> Command:
    """`--token-file` and `--cafile`, as the arguments `token_file` and `cafile` (Path or
    None)."""
    command = click.option(
        "--cafile",
        type=click.Path(dir_okay=False, path_type=Path),
        help="PEM CA bundle that verifies an https:// publisher (default: the system's CAs).",
    )(command)
    return click.option(
        "--token-file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="A file holding the bearer token (default: the CHANGEFEED_TOKEN environment "
        "variable).",
    )(command)


__all__ = ["credential_options"]
