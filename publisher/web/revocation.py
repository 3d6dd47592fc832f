"""Credentials that stop being valid while their listener is connected.

A listener is authenticated once, at its upgrade. When a reload removes its identity (the token
or certificate identity of that name), or a scope it listens with, or the identity expires, the
listener is closed with 1008 and a reason naming the identity and why, never the token. A
rotation (the identity's token replaced by a new one) closes nothing (`Authenticator.recheck`):

- `revoke(hub, authenticator, now)` checks every registered listener again (after a reload);
- `expire_forever(hub, access)` does it at each moment a configured `expires` or a listener's
  signed token's `exp` passes.

A listener treats 1008 as a rejection (docs/protocol.md#close-codes): it stops and reports the
reason instead of reconnecting with the same dead credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime
from typing import TYPE_CHECKING

import structlog

from changefeed.protocol import CloseCode
from publisher.config.scopes import refused_resources
from publisher.security.auth import Authenticator, Denied, now

if TYPE_CHECKING:
    from publisher.delivery.hub import Hub
    from publisher.web.access import Access

log = structlog.get_logger(__name__)

LONGEST_SLEEP = 60.0
"""Seconds `expire_forever` sleeps at most before looking again (a reload may have added an
earlier expiry)."""


def revoke(hub: Hub, authenticator: Authenticator, at: datetime) -> int:
    """Close every listener whose credentials `authenticator` no longer accepts at `at`, or whose
    identity lost a scope its registration needs; how many were closed."""
    closed = 0
    for conn in list(hub.connections):
        identity = conn.identity
        if identity is None or conn.closing:
            continue
        again = authenticator.recheck(identity, at)
        if isinstance(again, Denied):
            why = again.reason
        else:
            refused = refused_resources(
                again.scopes, [kind.resource for kind in conn.registration.kinds]
            )
            if not refused:
                conn.identified(again)
                continue
            why = f"identity {again.name!r} lacks listen:{refused[0]}"
        log.warning("listener closed: credentials no longer valid", identity=identity.name,
                    why=why, instance=conn.registration.instance,
                    service=conn.registration.service, remote=conn.remote)
        hub.close_now(conn, CloseCode.POLICY_VIOLATION, f"credentials no longer valid: {why}",
                      "credentialsRevoked")
        closed += 1
    return closed


async def expire_forever(hub: Hub, access: Access) -> None:
    """Close listeners as their tokens and certificate identities expire, and as the signed
    tokens (JWT) they registered with pass their `exp`."""
    while True:
        current = now()
        moments = [access.authenticator.next_expiry(current), *access.expiries_after(current)] + [
            conn.identity.expires for conn in hub.connections
            if conn.identity is not None and not conn.closing
        ]
        known = [m for m in moments if m is not None]
        wait = LONGEST_SLEEP
        if known:
            wait = min(wait, max((min(known) - current).total_seconds(), 0.0))
        access.expiring.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):  # not wait_for: on 3.11 it can lose a cancel
                await access.expiring.wait()
        revoke(hub, access.authenticator, now())


__all__ = ["LONGEST_SLEEP", "expire_forever", "revoke"]
