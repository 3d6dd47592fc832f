"""`GET /healthz` (liveness) and `GET /readyz` (readiness), for load balancers and Kubernetes.

- `/healthz`: 200 while the process serves HTTP. It does not look at Redis: restarting a
  publisher does not bring Redis back, so a liveness check must not fail with it.
- `/readyz`: 200 when this publisher can take new listeners: Redis answers a PING, the tail is
  reading (not retrying) and within `health.maxLagItems` items and `health.maxLagSeconds` of the
  bucket's head, and the process is not draining (SIGTERM). Otherwise 503 with the reasons.

Both answer JSON: `{"status": "ok"|"unavailable", "reasons": [...], "checks": {...}}`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from changefeed.errors import BucketUnavailable
from publisher.web.app_keys import BUCKET, LIFECYCLE, LIVE, TAIL
from publisher.web.http import json_response

PING_TIMEOUT = 2.0
"""Seconds /readyz waits for Redis to answer its PING."""


def tail_reasons(app: web.Application) -> list[str]:
    """Why the tail makes this publisher not ready (no I/O): the metrics' `changefeed_ready`
    uses it too."""
    lifecycle, tail, health = app[LIFECYCLE], app[TAIL], app[LIVE].config.health
    reasons = []
    if lifecycle.draining:
        reasons.append("draining: the publisher is shutting down")
    if not tail.healthy:
        reasons.append("tail not reading: the bucket is unreachable or was not read yet")
    items, seconds = tail.lag()
    if items > health.max_lag_items:
        reasons.append(f"tail {items} items behind the head (health.maxLagItems "
                       f"{health.max_lag_items})")
    if seconds > health.max_lag_seconds:
        reasons.append(f"tail {seconds:.1f} s behind the head (health.maxLagSeconds "
                       f"{health.max_lag_seconds:g})")
    return reasons


async def healthz(request: web.Request) -> web.Response:
    return json_response(
        {"status": "ok", "publisher": request.app[LIFECYCLE].publisher_id}
    )


async def readyz(request: web.Request) -> web.Response:
    app = request.app
    reasons = tail_reasons(app)
    redis: str = "ok"
    try:
        await asyncio.wait_for(app[BUCKET].log.ping("readiness ping"), PING_TIMEOUT)
    except BucketUnavailable as exc:
        redis = str(exc)
    except TimeoutError:
        redis = f"readiness ping: no answer from Redis within {PING_TIMEOUT:g} s"
    if redis != "ok":
        reasons.insert(0, f"redis unreachable: {redis}")
    items, seconds = app[TAIL].lag()
    body: dict[str, Any] = {
        "status": "unavailable" if reasons else "ok",
        "reasons": reasons,
        "publisher": app[LIFECYCLE].publisher_id,
        "checks": {
            "redis": redis,
            "tail": {"healthy": app[TAIL].healthy, "itemsBehind": items, "secondsBehind": seconds},
            "draining": app[LIFECYCLE].draining,
        },
    }
    headers = {"Cache-Control": "no-store"}
    return json_response(body, 503 if reasons else 200, headers)


routes = [web.get("/healthz", healthz), web.get("/readyz", readyz)]


__all__ = ["routes", "tail_reasons"]
