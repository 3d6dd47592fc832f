"""Browser origins and hosts: which cross-site requests and websockets are refused. Pure code.

A browser sends `Origin` with every websocket upgrade and every cross-origin request; other
clients send none. A request with an `Origin` not in `allowedOrigins` is refused (403): so a page
on another site cannot open a listener's websocket with the user's network position (cross-site
websocket hijacking), nor read the routes. Requests without `Origin` are unaffected.

Without authentication on a loopback address, the `Host` must name the loopback too: a page whose
DNS name is rebound to 127.0.0.1 sends its own name as `Host` (DNS rebinding).
"""

from __future__ import annotations

from collections.abc import Collection

from publisher.config.security import is_loopback, normal_origin

PREFLIGHT_MAX_AGE = 600
ALLOWED_HEADERS = "Authorization, Content-Type, Accept-Version"


def origin_refused(origin: str | None, allowed: Collection[str]) -> bool:
    """True when a request with `origin` must be refused."""
    if origin is None:
        return False
    normal = normal_origin(origin)
    return normal is None or normal not in allowed


def host_refused(host: str | None) -> bool:
    """True when `host` (the Host header) is not a loopback name or address."""
    if not host:
        return False  # HTTP/1.0 without Host: no browser
    if host.startswith("["):
        name = host[1:host.find("]")] if "]" in host else host
    else:
        name = host.rpartition(":")[0] if host.count(":") == 1 else host
    return not is_loopback(name)


def cors_headers(origin: str) -> dict[str, str]:
    """The headers that let the page at `origin` (allowed) read a response."""
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}


def preflight_headers(origin: str) -> dict[str, str]:
    return {
        **cors_headers(origin),
        "Access-Control-Allow-Methods": "GET, HEAD, POST",
        "Access-Control-Allow-Headers": ALLOWED_HEADERS,
        "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE),
    }


__all__ = ["cors_headers", "host_refused", "origin_refused", "preflight_headers"]
