"""`changefeed snoop`: print a publisher's change items as they arrive (Triton's changefeedsnoop).

It registers without bootstrapping (for some ids and id prefixes only, with --id and --prefix),
prints one line per change item on stdout (JSON lines with --json or when stdout is not a
terminal), reports reconnects and resyncs on stderr, and stops cleanly on Ctrl-C. Its token
comes from --token-file or CHANGEFEED_TOKEN (never the command line, which others can read).
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import click
import orjson

from changefeed.client_options import credential_options
from changefeed.errors import (
    AccessDenied,
    ChangefeedError,
    InvalidOption,
    RegistrationRejected,
    RetriesExhausted,
)
from changefeed.watch import Watch
from listener.client import Listener
from listener.config import ListenerConfig
from listener.events import ChangeEvent, Event, Resync
from listener.options import ClientOptions, client_options


def format_change(event: ChangeEvent, as_json: bool) -> str:
    """One output line for a change item."""
    if as_json:
        return orjson.dumps(event.item.to_wire()).decode()
    when = datetime.fromtimestamp(event.item.published / 1000, UTC)
    stamp = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return (f"{stamp}  {event.resource:<10} {event.id}  "
            f"{','.join(event.sub_resources)}  {event.cursor}")


async def run_snoop(
    url: str | Sequence[str],
    resource: str,
    subs: Sequence[str] = ("*",),
    since: str | None = None,
    as_json: bool | None = None,
    ids: Sequence[str] = (),
    prefixes: Sequence[str] = (),
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    config: ListenerConfig | None = None,
    options: ClientOptions | None = None,
) -> None:
    """Print every change item of `resource` (and `subs`; only of `ids` and `prefixes` when
    given) until cancelled; `options` are the listener's (`client_options(...)`)."""
    if as_json is None:
        as_json = not out.isatty()
    instance = f"snoop-{uuid.uuid4()}"

    def note(text: str) -> None:
        print(text, file=err, flush=True)

    def on_error(error: ChangefeedError) -> None:
        note(f"snoop: connection failed ({error}); reconnecting")

    def on_resync(event: Event) -> None:
        if isinstance(event, Resync):
            note(f"snoop: resync: {event.reason}; changes may have been missed")

    def on_change(event: ChangeEvent) -> None:
        print(format_change(event, as_json), file=out, flush=True)

    listener = Listener(url, instance=instance, service="snoop",
                        resources={resource: list(subs)},
                        watches={resource: Watch.of(ids, prefixes)}, since=since, config=config,
                        bootstrap=False, options=options)
    async with listener:
        await listener.run(on_bootstrap=on_resync, on_change=on_change, on_error=on_error)


@click.command()
@click.argument("url")
@click.argument("resource")
@click.option(
    "--sub",
    "subs",
    default="*",
    show_default=True,
    help="Comma-separated sub-resources to hear about ('*': all).",
)
@click.option("--since", help="A cursor: start with the changes after it.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    default=None,
    help="JSON lines (the default when stdout is not a terminal).",
)
@click.option(
    "--id", "ids", multiple=True, help="Only this id (repeatable; with --prefix: either)."
)
@click.option(
    "--prefix",
    "prefixes",
    multiple=True,
    help="Only ids under this '/'-separated prefix, and the prefix itself (repeatable).",
)
@credential_options
def snoop(
    url: str,
    resource: str,
    subs: str,
    since: str | None,
    as_json: bool | None,
    ids: tuple[str, ...],
    prefixes: tuple[str, ...],
    token_file: Path | None,
    cafile: Path | None,
) -> None:
    """Print RESOURCE's change items from the publisher at URL as they arrive; Ctrl-C stops.

    URL may be repeated with commas to rotate between publishers on failure.
    """
    sub_resources = [s.strip() for s in subs.split(",") if s.strip()]
    urls = [u.strip() for u in url.split(",") if u.strip()]
    try:
        asyncio.run(
            run_snoop(
                urls, resource, sub_resources, since, as_json or None, ids=ids, prefixes=prefixes,
                options=client_options(token_file=token_file, cafile=cafile),
            )
        )
    except KeyboardInterrupt:
        pass
    except (AccessDenied, InvalidOption, RegistrationRejected, RetriesExhausted,
            ValueError) as exc:
        raise click.ClickException(str(exc)) from None
