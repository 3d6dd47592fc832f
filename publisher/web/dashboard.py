"""`GET /changefeeds/dashboard`: a live page of the fleet, for people.

One self-contained HTML file (`dashboard.html` beside this module, inline CSS and script, no
build step, nothing loaded from elsewhere) that polls `/changefeeds/stats?scope=fleet` every two
seconds and shows the publishers, what each reads from PostgreSQL (the capture's lag in bytes
and seconds, the outbox's backlog and oldest row), the listeners per change kind, and
deliveries per second and tail lag over the last minutes.
"""

from __future__ import annotations

from importlib.resources import files

from aiohttp import web

PAGE = files("publisher.web").joinpath("dashboard.html").read_bytes()


async def dashboard(request: web.Request) -> web.Response:
    return web.Response(
        body=PAGE,
        content_type="text/html",
        charset="utf-8",
        headers={
            "Cache-Control": "no-cache",
            # The page loads nothing but itself and its own JSON.
            "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
            "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
        },
    )


routes = [web.get("/changefeeds/dashboard", dashboard)]


__all__ = ["routes"]
