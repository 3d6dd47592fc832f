"""Fleet-wide stats: every publisher advertises itself in Redis; any one answers for all.

Every `fleet.interval` seconds a publisher stores its report (what `/changefeeds/stats` says of
it, plus its counters) in the bucket with a TTL of `fleet.ttl` seconds, and removes it when it
stops cleanly. One that dies stops renewing its report, and it disappears within the TTL.
`GET /changefeeds/stats?scope=fleet` reads every live report: the RFD 5 shape (`listeners`,
`registrations`) over the whole fleet, plus `publishers`, one summary each with `lastSeen`
(seconds since its last report, measured by Redis's clock).

"The fleet" is every publisher of one bucket; "cluster" means a Redis Cluster only. The first
spelling, `?scope=cluster`, is kept as an alias of `?scope=fleet`, and the reply's `"scope"`
stays `"cluster"` whichever spelling asked, for the clients that read it (docs/http.md).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any

import orjson
import structlog
from aiohttp import web

from changefeed.errors import BucketUnavailable
from publisher.delivery.hub import Hub
from publisher.delivery.hub_stats import coalescing, registrations
from publisher.web.access import identity_of
from publisher.web.app_keys import ACCESS, BUCKET, CAPTURE, HUB, LIFECYCLE, LIVE, OUTBOX, TAIL
from publisher.web.health import tail_reasons
from publisher.web.http import json_response
from publisher.web.metrics import Activity, package_version

log = structlog.get_logger(__name__)


def local_stats(app: web.Application) -> dict[str, Any]:
    """This process's `/changefeeds/stats` (the RFD 5 shape, plus the tail and close counters)."""
    hub, publisher_id = app[HUB], app[LIFECYCLE].publisher_id
    relay = app.get(OUTBOX)
    outbox = {} if relay is None else {"outbox": relay.stats.report()}
    capture = app.get(CAPTURE)
    if capture is not None:
        outbox["capture"] = capture.report()
    return {
        "listeners": len(hub.connections),
        "registrations": registrations(hub, app[TAIL], publisher_id),
        "publisher": publisher_id,
        "tail": app[TAIL].stats(),
        "closed": dict(hub.counters.closed),
        "coalesced": coalescing(hub),
        "refused": app[ACCESS].counts(),
        "sse": sse_stats(hub),
        **outbox,
    }


def sse_stats(hub: Hub) -> dict[str, Any]:
    """The server-sent events streams: open now, items written, streams ended by whom."""
    return {
        "subscribers": sum(1 for conn in hub.connections if conn.sse),
        "itemsSent": hub.counters.sse_delivered,
        "disconnects": {"listener": hub.counters.sse_ended["listener"],
                        "publisher": hub.counters.sse_ended["publisher"]},
    }


def report(app: web.Application, url: str, started_at: float) -> dict[str, Any]:
    """What a publisher advertises of itself."""
    hub = app[HUB]
    return {
        **local_stats(app),
        "url": url,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "version": package_version(),
        "startedAt": _iso(started_at),
        "advertisedAt": _iso(time.time()),
        "ttl": app[LIVE].config.fleet.ttl,
        "itemsDelivered": hub.counters.delivered,
        "bytesWritten": hub.counters.bytes_written,
        "longPollsWaiting": hub.waiters.waiting,
        "ready": not tail_reasons(app),
        "draining": app[LIFECYCLE].draining,
    }


def _iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}Z"


async def fleet_stats(app: web.Application) -> dict[str, Any]:
    """Every live publisher's report, merged: the fleet's listeners and registrations, and one
    summary per publisher (its report without the registrations, with `lastSeen`)."""
    publishers = []
    registrations: list[Any] = []
    for publisher_id, raw, left in await app[BUCKET].fleet.publishers():
        try:
            one = orjson.loads(raw)
        except orjson.JSONDecodeError:
            log.warning("fleet: unreadable report skipped", publisher=publisher_id)
            continue
        registrations.extend(one.pop("registrations", []))
        one["publisher"] = publisher_id
        one["lastSeen"] = round(max(float(one.get("ttl", 0)) - left, 0.0), 3)
        publishers.append(one)
    return {
        "scope": "cluster",  # the reply's value since fleet stats began: kept for its readers
        "listeners": sum(int(p.get("listeners", 0)) for p in publishers),
        "registrations": registrations,
        "publishers": publishers,
        "publisher": app[LIFECYCLE].publisher_id,
    }


FLEET_SCOPES = ("fleet", "cluster")
"""The spellings of the fleet's scope: `fleet`, and `cluster`, its first name, kept as an alias."""


async def stats_of_scope(request: web.Request) -> web.Response:
    """`/changefeeds/stats[?scope=process|fleet]` (`cluster`: an alias of `fleet`)."""
    scope = request.query.get("scope", "process")
    if scope == "process" or scope in FLEET_SCOPES:
        body = local_stats(request.app) if scope == "process" else await fleet_stats(request.app)
        if not identity_of(request).allows("stats"):  # counts only (docs/security.md)
            del body["registrations"]
        return json_response(body)
    return json_response(
        {"code": "InvalidScope",
         "message": "scope must be 'process' (default) or 'fleet' ('cluster' is its alias)"},
        400,
    )


class Advertiser:
    """The background task that keeps this publisher's report in Redis."""

    def __init__(self, app: web.Application, activity: Activity) -> None:
        self.app = app
        self.activity = activity
        self.url = ""
        self.started_at = time.time()
        self._failing = False

    async def advertise_once(self) -> None:
        app = self.app
        body = orjson.dumps(report(app, self.url, self.started_at))
        await app[BUCKET].fleet.advertise(
            app[LIFECYCLE].publisher_id, body, app[LIVE].config.fleet.ttl
        )

    async def run(self) -> None:
        while True:
            try:
                await self.advertise_once()
                if self._failing:
                    log.info("fleet: advertising again")
                self._failing = False
            except BucketUnavailable as exc:
                self.activity.redis_failed("advertise")
                if not self._failing:
                    log.warning("fleet: cannot advertise this publisher", error=str(exc))
                self._failing = True
            await asyncio.sleep(self.app[LIVE].config.fleet.interval)

    async def withdraw(self) -> None:
        """Remove the report (a clean stop): the fleet sees this publisher gone at once."""
        try:
            await asyncio.wait_for(
                self.app[BUCKET].fleet.withdraw(self.app[LIFECYCLE].publisher_id), 2.0
            )
        except (BucketUnavailable, TimeoutError) as exc:
            log.info("fleet: report left to expire", error=str(exc))


__all__ = [
    "FLEET_SCOPES",
    "Advertiser",
    "fleet_stats",
    "local_stats",
    "report",
    "sse_stats",
    "stats_of_scope",
]
