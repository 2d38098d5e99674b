"""Who is on the other end: the TCP peer, and the client address a trusted proxy forwarded.

Forwarded headers (X-Forwarded-For, identity headers) count only when the TCP peer is inside one of
`server.trusted_proxies`; from any other peer they are untrusted input.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from functools import lru_cache

from starlette.requests import Request

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=32)
def _networks(cidrs: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)


def peer_address(request: Request) -> str | None:
    return request.client.host if request.client is not None else None


def peer_is_trusted(request: Request, trusted_proxies: Sequence[str]) -> bool:
    peer = peer_address(request)
    if peer is None or not trusted_proxies:
        return False
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return False
    return any(address in network for network in _networks(tuple(trusted_proxies)))


def client_address(request: Request, trusted_proxies: Sequence[str]) -> str:
    """The browser's address: the nearest untrusted hop of X-Forwarded-For behind trusted proxies, else the peer."""
    peer = peer_address(request) or "unknown"
    if not peer_is_trusted(request, trusted_proxies):
        return peer
    forwarded = request.headers.get("x-forwarded-for", "")
    hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
    networks = _networks(tuple(trusted_proxies))
    for hop in reversed(hops):  # walk back from the proxy nearest to us
        try:
            address = ipaddress.ip_address(hop)
        except ValueError:
            return peer  # a malformed chain is not believed
        if not any(address in network for network in networks):
            return hop
    return hops[0] if hops else peer
