"""The client's address: the peer's, or what a trusted proxy says in X-Forwarded-For.

Only peers in `server.trustedProxies` are believed. Their `X-Forwarded-For` is read from the
right (the entry the nearest proxy appended) leftwards, skipping the addresses of trusted proxies;
the first address that is not one is the client. So a client cannot choose its address by sending
an X-Forwarded-For of its own: the proxy appends the address it saw, and only what trusted proxies
appended is taken. Pure code but for reading the request.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from aiohttp import web

from publisher.config.settings import IPNetwork


def is_trusted(address: str, trusted: Sequence[IPNetwork]) -> bool:
    if not trusted:
        return False
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in trusted)


class Trusted:
    """The trusted proxies as a container of addresses: `"10.1.2.3" in trusted`."""

    def __init__(self, networks: Sequence[IPNetwork]) -> None:
        self.networks = tuple(networks)

    def __contains__(self, address: object) -> bool:
        return isinstance(address, str) and is_trusted(address, self.networks)


def client_of(peer: str, forwarded_for: Sequence[str], trusted: Sequence[IPNetwork]) -> str:
    """The client behind `peer`, given the X-Forwarded-For header values (in order)."""
    if not is_trusted(peer, trusted):
        return peer
    hops = [hop.strip() for value in forwarded_for for hop in value.split(",") if hop.strip()]
    client = peer
    for hop in reversed(hops):
        try:
            hop = str(ipaddress.ip_address(hop.strip("[]")))
        except ValueError:
            break  # not an address (a proxy's `unknown`, a port): trust nothing further left
        client = hop
        if not is_trusted(hop, trusted):
            break
    return client


def client_address(request: web.Request, trusted: Sequence[IPNetwork]) -> str:
    """The address of the client of `request` ("local" on a unix socket)."""
    peer = request.remote or "local"
    return client_of(peer, request.headers.getall("X-Forwarded-For", []), trusted)


__all__ = ["Trusted", "client_address", "client_of", "is_trusted"]
