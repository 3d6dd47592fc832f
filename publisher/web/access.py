"""Access control: what the publisher checks before a request reaches a handler, and when a
listener registers.

`Access.check`, called by the publisher's middleware (publisher.web.edge) before any handler, checks
in this order (each refusal is a JSON body `{"code", "message"}`, logged once per client address
and code per interval, counted in `/changefeeds/stats`):

1. the client address's request rate (`clientLimits.requestsPerSecond`): 429 `TooManyRequests`
   with `Retry-After`;
2. `Origin`, when sent, against `allowedOrigins`: 403 `OriginNotAllowed` (and, without an `auth`
   section, `Host` against the loopback: 403 `HostNotAllowed`); a CORS preflight of an allowed
   origin is answered here (204);
3. the identity (`publisher.security.auth`): 401 `Unauthorized` with `WWW-Authenticate: Bearer`.
   The token comes from `Authorization`, or, on the upgrade and SSE routes where a browser cannot
   set that header, from a `changefeed.bearer.<JWT>` subprotocol or `?access_token=<JWT>`;
4. the route's scope (`scope_needed`): 403 `Forbidden`.

`registration_refusal` checks a listener's registration: its resources against the identity's
`listen:` scopes, the client's registration rate and the global listener cap (the refusals of
`publisher.web.registrations`, whose table gives their close codes and HTTP statuses).

The `Access` object lives as long as the service; `replace(security)` swaps in a reloaded
config's tokens, origins and limits (established connections keep their identity).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import structlog
from aiohttp import web

from changefeed.errors import ConfigError
from changefeed.protocol import Registration
from publisher.config.logs import Throttle
from publisher.config.scopes import may_listen, refused_resources
from publisher.config.security import ClientLimits, Security
from publisher.config.settings import IPNetwork
from publisher.security.auth import Authenticator, Denied, Identity, now
from publisher.security.clientaddr import client_address
from publisher.security.jwt import looks_like_jwt
from publisher.security.origin import cors_headers, host_refused, origin_refused, preflight_headers
from publisher.security.ratelimit import TokenBuckets, retry_after
from publisher.web.http import json_error
from publisher.web.registrations import Refused, Why
from publisher.web.registrations import refused as refused_registration

log = structlog.get_logger(__name__)

IDENTITY = web.RequestKey("identity", Identity)
CORS = web.RequestKey("cors", dict[str, str])
"""The CORS headers of a request from an allowed origin, for a handler that prepares its own
streaming answer (the middleware adds them to any other answer)."""
"""The identity of a request, set by `Access.check`."""
NOBODY = Identity("nobody", frozenset(), "none")
"""The identity of a request `Access.check` did not see: nothing is allowed."""
LISTEN = "listen:<resource>"
"""What a websocket upgrade needs: a `listen:` scope for some resource."""
REALM = 'Bearer realm="changefeed"'
SUBPROTOCOL = "changefeed"
"""The websocket subprotocol the publisher selects when a client offers it."""
BEARER_SUBPROTOCOL = "changefeed.bearer."
"""A `Sec-WebSocket-Protocol` value carrying a browser's token: `changefeed.bearer.<JWT>`."""
TOKEN_PARAMETER = "access_token"
"""The query parameter carrying a browser's token on the upgrade and on SSE."""
BROWSER_ROUTES = frozenset({"/changefeeds", "/changefeeds/sse"})
"""Where a token may come without an Authorization header (a browser cannot set one there)."""


def offered_protocols(request: web.Request) -> list[str]:
    header = request.headers.get("Sec-WebSocket-Protocol", "")
    return [p.strip() for p in header.split(",") if p.strip()]


def selected_protocols(request: web.Request) -> tuple[str, ...]:
    """The subprotocols to give aiohttp's handshake: the first offered one that carries no token
    (our clients offer `changefeed` first), else the token carrier itself. Either way one of the
    offered values is selected, so aiohttp never logs the offered list (with a token in it)."""
    offered = offered_protocols(request)
    plain = [p for p in offered if not p.startswith(BEARER_SUBPROTOCOL)]
    return tuple((plain or offered)[:1])


def credentials_of(request: web.Request) -> tuple[str | None, bool]:
    """The request's `Authorization`, or, on the upgrade and SSE routes only, `Bearer <token>`
    from a `changefeed.bearer.<token>` subprotocol or the `access_token` parameter; and whether
    it came by one of those browser carriers."""
    header = request.headers.get("Authorization")
    if header is not None or request.path not in BROWSER_ROUTES:
        return header, False
    for protocol in offered_protocols(request):
        if protocol.startswith(BEARER_SUBPROTOCOL):
            return "Bearer " + protocol.removeprefix(BEARER_SUBPROTOCOL), True
    token = request.query.get(TOKEN_PARAMETER)
    return (None, False) if token is None else ("Bearer " + token, True)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_PUBLIC = "__changefeed_public__"
_SCOPE = "__changefeed_scope__"


def public(handler: Handler) -> Handler:
    """Mark a route as open without credentials (health checks): only rate and origin apply."""
    setattr(handler, _PUBLIC, True)
    return handler


def requires(scope: str | Callable[[web.Request], str]) -> Callable[[Handler], Handler]:
    """Mark a route as needing `scope` (routes not marked need `admin`, or `publish` to write);
    a function of the request gives a scope that depends on it (`durable:<name>`)."""

    def mark(handler: Handler) -> Handler:
        setattr(handler, _SCOPE, scope)
        return handler

    return mark


def identity_of(request: web.Request) -> Identity:
    """The identity `Access.check` found for `request` (NOBODY, allowed nothing, if none)."""
    found = request.get(IDENTITY)
    return found if isinstance(found, Identity) else NOBODY


_FIXED_SCOPES = {
    "/changefeeds/events": "events",
    "/changefeeds/rpc": "events",
    "/changefeeds/feed/v1": "events",
}
_ANY_IDENTITY = frozenset({"/changefeeds", "/changefeeds/stats"})


class Access:
    """The checks of one service: built from its config's `security`, replaced on reload."""

    def __init__(
        self,
        security: Security,
        bootstrap_routes: Mapping[str, str],
        authenticator: Authenticator | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.trusted: Sequence[IPNetwork] = ()
        """server.trustedProxies: whose X-Forwarded-For names the client
        (publisher.security.clientaddr)."""
        self._routes = dict(bootstrap_routes)
        """bootstrap route -> resource."""
        self._clock = clock
        self.refused: Counter[str] = Counter()
        """Refusals by code, for /changefeeds/stats."""
        self.connections_refused: Callable[[], int] | None = None
        """The admission's count of refused connections (503 TooManyConnections)."""
        self._log = Throttle(10.0, clock)
        self.security = security
        self.authenticator = authenticator or Authenticator.build(security.auth)
        self._limits = security.client_limits
        self._requests, self._registrations = self._buckets(security.client_limits)
        self.expiring = asyncio.Event()
        """Set when an identity with an expiry came in: `expire_forever` looks again."""
        self.expiries: set[datetime] = set()
        """The `exp` of the signed tokens of upgrades and SSE streams, until they pass: when
        `expire_forever` checks the listeners again."""

    def replace(self, security: Security, authenticator: Authenticator | None = None) -> None:
        """Serve with a reloaded config's security: token files and environment variables are
        read first, so a ConfigError leaves everything as it was."""
        authenticator = authenticator or Authenticator.build(security.auth)
        if security.client_limits != self._limits:
            self._requests, self._registrations = self._buckets(security.client_limits)
            self._limits = security.client_limits
        self.security = security
        old, self.authenticator = self.authenticator, authenticator
        if old is not authenticator:
            old.close()

    def trust(self, proxies: Sequence[IPNetwork]) -> None:
        """Take the client's address from the X-Forwarded-For of `proxies` from now on
        (server.trustedProxies, at start and on reload)."""
        self.trusted = proxies

    def report_connections_refused(self, count: Callable[[], int]) -> None:
        """Show `count()`, the admission's refused connections, in `counts()`."""
        self.connections_refused = count

    def expiries_after(self, moment: datetime) -> set[datetime]:
        """The signed tokens' expiries still to come after `moment` (those passed are
        forgotten)."""
        self.expiries = {m for m in self.expiries if m > moment}
        return self.expiries

    def close(self) -> None:
        """The service stops: stop what the authenticator runs in the background."""
        self.authenticator.close()

    def counts(self) -> dict[str, int]:
        """Refusals since start by code: what /changefeeds/stats shows as `refused`."""
        counts = dict(sorted(self.refused.items()))
        if self.connections_refused is not None:
            counts["TooManyConnections"] = self.connections_refused()
        return counts

    def _buckets(self, limits: ClientLimits) -> tuple[TokenBuckets | None, TokenBuckets | None]:
        requests = registrations = None
        if limits.requests_per_second is not None:
            requests = TokenBuckets(limits.requests_per_second, limits.request_burst, self._clock)
        if limits.registrations_per_second is not None:
            registrations = TokenBuckets(
                limits.registrations_per_second, limits.registration_burst, self._clock
            )
        return requests, registrations

    # --- HTTP ------------------------------------------------------------------------------

    def check(self, request: web.Request) -> tuple[web.Response | None, dict[str, str] | None]:
        """What to do with `request` before its handler runs: the answer to give instead (a
        refusal, or the 204 of a CORS preflight), or None to run the handler; and the CORS
        headers to add to the handler's answer (None: none). Sets the request's identity
        (`identity_of`). publisher.web.edge calls it for every request."""
        origin = request.headers.get("Origin")
        refused = self._screen(request, origin)
        if refused is not None:
            return refused, None
        cors = cors_headers(origin) if origin is not None else None
        if (origin is not None and request.method == "OPTIONS"
                and "Access-Control-Request-Method" in request.headers):
            return web.Response(status=204, headers=preflight_headers(origin)), None
        route_handler = request.match_info.handler
        if getattr(route_handler, _PUBLIC, False):
            return None, None
        refused = self._authorize(request, cors)
        return (None, cors) if refused is None else (refused, None)

    def _screen(self, request: web.Request, origin: str | None) -> web.Response | None:
        """The refusal of `request` before anyone is identified (its client's request rate, its
        origin, its host without an auth section), or None."""
        remote = client_address(request, self.trusted)
        if self._requests is not None:
            wait = self._requests.take(remote)
            if wait:
                seconds = retry_after(wait)
                return self._refuse(
                    request, 429, "TooManyRequests",
                    f"too many requests from {remote} (clientLimits.requestsPerSecond "
                    f"{self._requests.rate:g}); retry after {seconds} s",
                    {"Retry-After": str(seconds)},
                )
        if origin is not None and origin_refused(origin, self.security.allowed_origins):
            return self._refuse(
                request, 403, "OriginNotAllowed",
                f"origin {origin[:200]!r} is not one of this publisher's allowedOrigins",
            )
        if self.security.auth is None and host_refused(request.headers.get("Host")):
            return self._refuse(
                request, 403, "HostNotAllowed",
                "without an auth section the publisher answers only requests to a loopback "
                "host name or address",
            )
        return None

    def _authorize(self, request: web.Request, cors: dict[str, str] | None) -> web.Response | None:
        """Identify `request` (401 unless its credentials are valid) and check that the identity
        has the scope its route needs (403 unless): the refusal, or None."""
        found = self._identify(request)
        if isinstance(found, Denied):
            challenge = REALM + (', error="invalid_token"' if found.token_given else "")
            message = (
                "the credentials are not valid" if found.token_given
                else "credentials required: Authorization: Bearer <token>"
            )
            return self._refuse(
                request, 401, "Unauthorized", message,
                {"WWW-Authenticate": challenge, **(cors or {})}, why=found.reason,
                token_hash=found.token_hash,
            )
        request[IDENTITY] = found
        needed = self.scope_needed(request)
        if needed is not None and not (
            may_listen(found.scopes) if needed == LISTEN else found.allows(needed)
        ):
            return self._refuse(
                request, 403, "Forbidden",
                f"identity {found.name!r} lacks the scope {needed} for {request.method} "
                f"{request.path}",
                cors, identity=found.name,
            )
        return None

    def _identify(self, request: web.Request) -> Identity | Denied:
        """Who `request` comes from: its token (a browser's by its carriers, a JWT only) or its
        client certificate. A signed token's expiry is noted for `expire_forever`."""
        authorization, carried = credentials_of(request)
        if carried and authorization is not None and not looks_like_jwt(
            authorization.removeprefix("Bearer ")
        ):
            return Denied("a token in access_token or a subprotocol must be a JWT (auth.jwt)",
                          token_given=True)
        peercert = None
        if request.transport is not None:
            peercert = request.transport.get_extra_info("peercert")
        found = self.authenticator.authenticate(authorization, peercert, now())
        if (isinstance(found, Identity) and found.expires is not None
                and request.path in BROWSER_ROUTES):
            self.expiries.add(found.expires)  # a connection that may outlive its token
            self.expiring.set()
        return found

    def scope_needed(self, request: web.Request) -> str | None:
        """The scope `request`'s route needs; None: any identity (or no such route)."""
        if request.match_info.http_exception is not None:
            return None  # 404 or 405: answered as such, to an identity
        path = request.path
        if path in _ANY_IDENTITY:
            upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
            return LISTEN if path == "/changefeeds" and upgrade else None
        if path in _FIXED_SCOPES:
            return _FIXED_SCOPES[path]
        for route, resource in self._routes.items():
            if path == route or path.startswith(route + "/"):
                return f"read:{resource}"
        marked = getattr(request.match_info.handler, _SCOPE, None)
        if isinstance(marked, str):
            return marked
        if callable(marked):
            needed: str = marked(request)
            return needed
        return "admin" if request.method in ("GET", "HEAD") else "publish"

    def _refuse(
        self,
        request: web.Request,
        status: int,
        code: str,
        message: str,
        headers: dict[str, str] | None = None,
        why: str | None = None,
        **fields: Any,
    ) -> web.Response:
        remote = client_address(request, self.trusted)
        self.refused[code] += 1
        suppressed = self._log.allow(f"{remote} {code} {why or ''}")
        if suppressed is not None:
            log.warning(
                "request refused", status=status, code=code, reason=why or message,
                remote=remote, method=request.method, path=request.path,
                suppressed=suppressed, **{k: v for k, v in fields.items() if v is not None},
            )
        response = json_error(status, code, message, headers)
        if request.headers.get("Upgrade", "").lower() == "websocket":
            response.force_close()
        return response

    # --- websocket registrations ------------------------------------------------------------

    def registration_refusal(
        self, identity: Identity, registration: Registration, remote: str, listeners: int
    ) -> Refused | None:
        """The refusal of `registration` (publisher.web.registrations), or None to accept it."""
        refused = refused_resources(identity.scopes, [k.resource for k in registration.kinds])
        if refused:
            return self._refuse_registration(
                remote, Why.FORBIDDEN,
                f"not authorized to listen for {', '.join(refused)}: identity {identity.name!r} "
                f"lacks listen:{refused[0]}",
            )
        if self._registrations is not None:
            wait = self._registrations.take(remote)
            if wait:
                return self._refuse_registration(
                    remote, Why.TOO_MANY_REGISTRATIONS,
                    f"too many registrations from {remote} (clientLimits.registrationsPerSecond);"
                    f" retry after {retry_after(wait)} s",
                )
        most = self._limits.max_listeners
        if most is not None and listeners >= most:
            return self._refuse_registration(
                remote, Why.TOO_MANY_LISTENERS,
                f"publisher full: {most} listeners (clientLimits.maxListeners); try again later",
            )
        return None

    def _refuse_registration(self, remote: str, why: Why, reason: str) -> Refused:
        refusal = refused_registration(why, reason)
        self.refused[why.value] += 1
        suppressed = self._log.allow(f"{remote} {why.value}")
        if suppressed is not None:
            log.warning("registration refused", code=int(refusal.close_code), reason=reason,
                        remote=remote, suppressed=suppressed)
        return refusal


def check_reload(old: Security, new: Security) -> None:
    """Refuse a reload that would need a restart: TLS turned on or off."""
    if (old.tls is None) != (new.tls is None):
        raise ConfigError("tls", "<changed>", "a restart to turn TLS on or off, not a reload")


__all__ = [
    "IDENTITY",
    "Access",
    "check_reload",
    "identity_of",
    "public",
    "requires",
]
