"""`changefeed trace CURSOR --url URL`: what every publisher of the fleet did with one change.

The change's commit time is its cursor's (the Redis time of its log id). The command reads the
fleet's reports (`/changefeeds/stats?scope=fleet` of the publisher at URL: each publisher
advertises its address) and asks each publisher `GET /changefeeds/trace/<cursor>`: when its
tail read the change, and how many listeners of each service it was written to, first and last
write. Publishers that share an address (`serve --workers N` on one port) are asked over new
connections until each has answered or 10N tries were made; an advertised wildcard host
(0.0.0.0, ::) is replaced by URL's. Both routes need a token with the `stats` scope; it is sent
to every advertised publisher (addresses from the fleet's own Redis). `--this-publisher` asks
only the one at URL. docs/operations.md#tracing-a-change shows the output.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import aiohttp
import click
import orjson

from changefeed.credentials import Credentials
from changefeed.cursor import Position
from changefeed.errors import CursorError
from publisher.cli.commands import _credentials, base_url
from publisher.delivery.trace import iso

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
TIMEOUT = 10.0
"""Seconds one request may take."""


@dataclass(slots=True)
class Answer:
    """One publisher's reply to the trace route."""

    address: str
    status: int
    body: dict[str, Any]


@dataclass(slots=True)
class Gathered:
    """Every reply, by publisher id, and the publishers the fleet advertised but that did not
    answer (by id: why)."""

    answers: dict[str, Answer] = field(default_factory=dict)
    unreached: dict[str, str] = field(default_factory=dict)


def peer_address(advertised: str, url: str) -> str:
    """The address to ask a publisher at: its advertised URL, with a wildcard host (it listens
    on every interface) replaced by the host of `url`. Pure."""
    parts = urlsplit(advertised)
    if parts.hostname is not None and parts.hostname not in WILDCARD_HOSTS:
        return advertised.rstrip("/")
    host = urlsplit(url).hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, "", "", "")).rstrip("/")


def advertised(stats: Mapping[str, Any], url: str) -> dict[str, str]:
    """publisher id -> address, from a `?scope=fleet` stats body ("" for a publisher that
    advertised no address yet). Pure."""
    out = {}
    for one in stats.get("publishers", []):
        if isinstance(one, dict) and one.get("publisher"):
            address = str(one.get("url") or "")
            out[str(one["publisher"])] = address and peer_address(address, url)
    return out


def _ms(value: Any) -> str:
    return f"+{value:.1f} ms" if isinstance(value, int | float) else "?"


OUT_OF_LOG = frozenset({"OtherEpoch", "NoSuchChange"})
"""The answers of a publisher whose log has no change at the cursor."""
SKEW_MS = 60_000
"""How far past the host's clock a cursor's time may be (Redis's clock ahead of the host's)
and still be taken for a commit's."""


def committed_at(cursor: Position, gathered: Gathered, now: float) -> str | None:
    """When the change at `cursor` was committed (its cursor's time), or None when the cursor
    is not in the log: the start of a bucket (0-0), a time to come, or no publisher's log has
    it. Pure."""
    ms = cursor.position.ms
    if any(a.status == 200 for a in gathered.answers.values()):
        return iso(ms / 1000)
    if ms == 0 or ms > now * 1000 + SKEW_MS:
        return None
    codes = {a.body.get("code") for a in gathered.answers.values()}
    if codes and codes <= OUT_OF_LOG:
        return None
    return iso(ms / 1000)


def render(cursor: Position, gathered: Gathered, now: float | None = None) -> list[str]:
    """The readable report (`now`: the host's clock, time.time() by default). Pure but for
    that default."""
    at = committed_at(cursor, gathered, time.time() if now is None else now)
    lines = [f"change {cursor.encode()}",
             f"committed  {at} (write times: ms after it; --json for each time)" if at else
             "committed  not in the log (no change of the log has this cursor)"]
    traced = listeners = 0
    for publisher_id, answer in sorted(gathered.answers.items()):
        body = answer.body
        lines.append("")
        lines.append(f"publisher {publisher_id} ({answer.address})")
        if answer.status != 200:
            lines.append(f"  {body.get('code', answer.status)}: {body.get('message', '')}")
            continue
        traced += 1
        listeners += int(body.get("listeners", 0))
        lines.append(f"  read       {body.get('readAt')}  ({_ms(body.get('readMs'))})")
        services = body.get("services") or {}
        if not services:
            lines.append("  written to no listener")
            continue
        rows = [("SERVICE", "LISTENERS", "FIRST WRITE", "LAST WRITE")]
        for name, writes in services.items():
            rows.append((name, str(writes.get("listeners")), _ms(writes.get("firstWriteMs")),
                         _ms(writes.get("lastWriteMs"))))
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines.extend("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)
    for publisher_id, why in sorted(gathered.unreached.items()):
        lines.append("")
        lines.append(f"publisher {publisher_id}: not reached ({why})")
    lines.append("")
    lines.append(f"written to {listeners} listener(s) by {traced} of "
                 f"{len(gathered.answers) + len(gathered.unreached)} publisher(s)")
    return lines


async def _get(
    session: aiohttp.ClientSession, url: str, credentials: Credentials, base: str
) -> tuple[int, dict[str, Any]]:
    async with session.get(url, headers=credentials.headers_for(url, base)) as response:
        text = await response.text()
        try:
            body = orjson.loads(text)
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            body = {"code": f"HTTP{response.status}", "message": text[:200]}
        return response.status, body


async def gather(url: str, cursor: str, credentials: Credentials, fleet: bool) -> Gathered:
    """Every publisher's answer for `cursor` (only the one at `url` unless `fleet`).
    Raises click.ClickException when the publisher at `url` refuses or cannot be reached."""
    base = url.rstrip("/")
    route = f"/changefeeds/trace/{quote(cursor, safe='')}"
    timeout = aiohttp.ClientTimeout(total=TIMEOUT)
    # A new connection per request: workers sharing a port are each reached in turn.
    connector = aiohttp.TCPConnector(ssl=credentials.ssl or True, force_close=True)
    gathered = Gathered()
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def ask(address: str) -> str | None:
            try:
                status, body = await _get(session, address + route, credentials, address)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                if address == base:
                    raise click.ClickException(f"cannot reach {url}: {exc}") from None
                return None
            if status in (400, 401, 403):
                raise click.ClickException(
                    f"{address}: HTTP {status} {body.get('code')}: {body.get('message')}"
                    + (" (the trace needs a token with the stats scope)" if status == 403 else "")
                )
            publisher_id = str(body.get("publisher") or address)
            gathered.answers.setdefault(publisher_id, Answer(address, status, body))
            return publisher_id

        await ask(base)
        if not fleet:
            return gathered
        status, stats = await _get(session, base + "/changefeeds/stats?scope=fleet",
                                   credentials, base)
        if status != 200:
            raise click.ClickException(f"{url}: cannot read the fleet: HTTP {status} "
                                       f"{stats.get('message', '')}")
        expected = advertised(stats, url)
        by_address: dict[str, set[str]] = {}
        for publisher_id, address in expected.items():
            if address:
                by_address.setdefault(address, set()).add(publisher_id)
            elif publisher_id not in gathered.answers:
                gathered.unreached[publisher_id] = "it advertises no address yet"

        async def reach(address: str, sharing: set[str]) -> None:
            # The kernel picks one of the publishers sharing the address per connection: ask
            # until each has answered (10 tries per publisher leave one unreached by chance
            # with odds of 2^-10 or less each).
            for _ in range(10 * len(sharing)):
                if sharing <= gathered.answers.keys():
                    return
                if await ask(address) is None:
                    break
            for publisher_id in sharing - gathered.answers.keys():
                gathered.unreached[publisher_id] = f"no answer from it at {address}"

        await asyncio.gather(*(reach(a, s) for a, s in by_address.items()))
    return gathered


@click.command()
@click.argument("cursor")
@click.option("--url", envvar="CHANGEFEED_URL", required=True,
              help="A publisher of the fleet (its base URL).")
@click.option("--this-publisher", is_flag=True,
              help="Ask only the publisher at --url, not every publisher of its fleet.")
@click.option("--json", "as_json", is_flag=True, help="Print every answer as JSON.")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path),
              help="A file holding the bearer token, stats scope (default: CHANGEFEED_TOKEN).")
@click.option("--cafile", type=click.Path(dir_okay=False, path_type=Path),
              help="PEM CA bundle that verifies https:// publishers (default: the system's).")
def trace(cursor: str, url: str, this_publisher: bool, as_json: bool,
          token_file: Path | None, cafile: Path | None) -> None:
    """Show when the change at CURSOR was committed, when each publisher's tail read it, and
    how many listeners of each service it was written to, and when (first and last write).

    Publishers keep the trace of their newest changes only (config.js `trace`); exit status 1
    when no publisher has it.
    """
    try:
        wanted = Position.decode_single(cursor)
    except CursorError as exc:
        raise click.BadParameter(str(exc), param_hint="CURSOR") from None
    credentials = _credentials(token_file, cafile)
    gathered = asyncio.run(gather(base_url(url), cursor, credentials, not this_publisher))
    if as_json:
        body = {
            "cursor": cursor,
            "committedAt": committed_at(wanted, gathered, time.time()),
            "publishers": [{"address": a.address, "status": a.status, **a.body}
                           for _, a in sorted(gathered.answers.items())],
            "unreached": gathered.unreached,
        }
        click.echo(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode())
    else:
        for line in render(wanted, gathered):
            click.echo(line)
    if not any(a.status == 200 for a in gathered.answers.values()):
        raise click.ClickException("no publisher has a trace of this change")


__all__ = [
    "Answer", "Gathered", "advertised", "committed_at", "gather", "peer_address", "render",
    "trace",
]
