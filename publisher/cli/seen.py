"""`changefeed publish --wait-seen-by SERVICE[,N]`: return once N listeners of SERVICE were sent
the committed item (read-your-writes for a writer that must know its listeners have it).

The publishers know what they sent: each registration in `/changefeeds/stats` carries
`lastCursorSent`, and a publisher sends a subscriber its items in log order, so a registration
whose `lastCursorSent` is at or past the item's cursor (same epoch) was sent the item, if the
item is for it. Only registrations whose change kind matches the item (resource, sub-resources,
watch) count: one the item does not match never "sees" it. Across several publishers the CLI
reads `/changefeeds/stats?scope=fleet` (every publisher's advertised report, refreshed every
`fleet.interval` seconds) merged with the fresh `/changefeeds/stats` of the publisher at `--url`,
and polls both every POLL seconds until enough listeners are counted or the time-out passes.
Both need an identity with the `stats` scope. docs/http.md documents it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import click

from changefeed.cursor import Position, reached
from changefeed.errors import CursorError, CursorGone
from changefeed.protocol import ChangeKind
from changefeed.watch import Watch

POLL = 0.2
"""Seconds between two reads of the stats while waiting."""


def parse_wait_seen_by(text: str) -> tuple[str, int]:
    """`SERVICE` or `SERVICE,N` (N defaults to 1)."""
    service, _, count = text.partition(",")
    if not service or (count and not (count.isascii() and count.isdigit() and int(count) >= 1)):
        raise click.BadParameter("expected SERVICE or SERVICE,N with N >= 1",
                                 param_hint="--wait-seen-by")
    return service, int(count) if count else 1


def seen_by(
    registrations: Iterable[Mapping[str, Any]],
    service: str,
    resource: str,
    subs: Iterable[str],
    changed_id: str,
    cursor: Position,
) -> tuple[int, int]:
    """(listeners of `service` the item is for, those of them sent it), from /changefeeds/stats
    registrations (one per listener and resource). Pure."""
    subs = tuple(subs)
    matching: set[tuple[str, ...]] = set()
    seen: set[tuple[str, ...]] = set()
    for reg in registrations:
        wire = reg.get("changeKind") or {}
        if reg.get("service") != service or wire.get("resource") != resource:
            continue
        kind = ChangeKind(resource, tuple(wire.get("subResources", ())),
                          Watch.of(wire.get("ids", ()), wire.get("prefixes", ())))
        if not kind.matches_item(subs, changed_id):
            continue
        who = tuple(str(reg.get(k)) for k in ("publisher", "instance", "remote", "connectedSince"))
        matching.add(who)
        sent = reg.get("lastCursorSent")
        if sent:
            try:
                # Composite cursors (a bucket in a Redis Cluster) too: each partition's.
                if reached(sent, cursor):
                    seen.add(who)
            except (CursorError, CursorGone):
                continue
    return len(matching), len(seen)


async def wait_seen(
    get_json: Callable[[str], Any], url: str, service: str, count: int, resource: str,
    subs: list[str], changed_id: str, cursor: str, timeout: float,
) -> int:
    """Poll the stats until `count` listeners of `service` were sent the item; returns how many
    were. Raises click.ClickException on time-out or without the `stats` scope."""
    wanted = Position.decode(cursor)
    base = url.rstrip("/")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    matching = seen = 0
    while True:
        local, fleet = await asyncio.gather(
            get_json(f"{base}/changefeeds/stats"),
            get_json(f"{base}/changefeeds/stats?scope=fleet"),
        )
        if "registrations" not in local:
            raise click.ClickException("--wait-seen-by needs a token with the stats scope")
        fresh = local.get("publisher")
        registrations = [r for r in fleet.get("registrations", [])
                         if r.get("publisher") != fresh] + local["registrations"]
        matching, seen = seen_by(registrations, service, resource, subs, changed_id, wanted)
        if seen >= count:
            return seen
        if loop.time() >= deadline:
            raise click.ClickException(
                f"{cursor}: sent to {seen} of the {count} listener(s) of {service} waited for "
                f"within {timeout:g} s ({matching} registered listener(s) of {service} are for "
                "this item)"
            )
        await asyncio.sleep(POLL)


Helpers = tuple[Callable[[Path | None, Path | None], Any], Callable[[str, Any, str], Any]]
"""The command line's `_credentials(token_file, cafile)` and `_get_json(url, credentials,
base)`."""


def wait_seen_by_options(
    helpers: Callable[[], Helpers],
) -> Callable[[Callable[..., str]], Callable[..., None]]:
    """Add --wait-seen-by (and --url, --token-file, --cafile, --wait-timeout) to `publish`,
    which returns the cursor it printed; `helpers()` gives the command line's HTTP helpers."""
    return functools.partial(_with_wait_seen_by, helpers=helpers)


def _with_wait_seen_by(
    command: Callable[..., str], helpers: Callable[[], Helpers]
) -> Callable[..., None]:

    @click.option("--wait-seen-by", "wait_seen_by",
                  help="SERVICE[,N]: then wait until N (default 1) listeners of SERVICE that the "
                  "item is for were sent it (exit 1 on time-out).")
    @click.option("--url", envvar="CHANGEFEED_URL",
                  help="A publisher of the fleet, for --wait-seen-by.")
    @click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path),
                  help="Token (stats scope) for --wait-seen-by; else CHANGEFEED_TOKEN.")
    @click.option("--cafile", type=click.Path(dir_okay=False, path_type=Path),
                  help="PEM CA bundle that verifies an https:// publisher.")
    @click.option("--wait-timeout", type=float, default=10.0, show_default=True,
                  help="Seconds --wait-seen-by waits.")
    @functools.wraps(command)
    def wrapper(wait_seen_by: str | None, url: str | None, token_file: Path | None,
                cafile: Path | None, wait_timeout: float, **kwargs: Any) -> None:
        target = None if wait_seen_by is None else parse_wait_seen_by(wait_seen_by)
        if target is not None and not url:
            raise click.UsageError("--wait-seen-by needs --url (or CHANGEFEED_URL)")
        cursor = command(**kwargs)
        if target is None or url is None:
            return
        _credentials, _get_json = helpers()
        credentials = _credentials(token_file, cafile)
        subs = [s.strip() for s in kwargs["subs"].split(",") if s.strip()]

        async def get(address: str) -> Any:
            try:
                return await _get_json(address, credentials, url)
            except (ValueError, OSError, aiohttp.ClientError) as exc:
                raise click.ClickException(f"{address}: {exc}") from None

        seen = asyncio.run(wait_seen(get, url, *target, kwargs["resource"], subs,
                                     kwargs["changed_id"], cursor, wait_timeout))
        click.echo(f"sent to {seen} listener(s) of {target[0]}", err=True)

    return wrapper


__all__ = ["parse_wait_seen_by", "seen_by", "wait_seen", "wait_seen_by_options"]
