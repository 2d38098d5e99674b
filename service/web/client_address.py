"""Who is on the other end: the TCP peer, and the client address a trusted proxy forwarded.

Forwarded headers count only when the TCP peer is inside one of `server.trusted_proxies`. `ForwardedClient`
applies uvicorn's `ProxyHeadersMiddleware` with that list (the client is the nearest untrusted X-Forwarded-For
hop; the scheme comes from X-Forwarded-Proto), and adds the two things it does not do: it keeps the TCP peer
(identity verifiers must know whether the request came through a trusted proxy, which is the peer, not the
forwarded client), and it does not believe a forwarded "address" that is not an IP address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from functools import lru_cache

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

PEER = "connector.peer"  # the scope key holding the TCP peer's address


@lru_cache(maxsize=32)
def _networks(cidrs: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


class ForwardedClient:
    """ASGI middleware: the client address behind trusted proxies (uvicorn's), the TCP peer kept in the scope."""

    def __init__(self, app: ASGIApp, *, trusted_proxies: Sequence[str]) -> None:
        self.app = app
        # Normalised: uvicorn reads "10.0.0.1/8" (host bits set) as a literal name, never as a network.
        trusted = [str(network) for network in _networks(tuple(trusted_proxies))]
        self.forwarded = ProxyHeadersMiddleware(self._believed, trusted_hosts=trusted)  # type: ignore[arg-type]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        scope[PEER] = client[0] if client else None
        await self.forwarded(scope, receive, send)  # type: ignore[arg-type]  # uvicorn's ASGI types vs starlette's

    async def _believed(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        if client and not _is_ip(client[0]) and scope.get(PEER) is not None:
            scope["client"] = (scope[PEER], 0)  # a malformed forwarded hop is not believed
        await self.app(scope, receive, send)


def peer_address(request: Request) -> str | None:
    """The TCP peer (the proxy, behind one), whatever the forwarded headers say."""
    if PEER in request.scope:
        peer = request.scope[PEER]
        return peer if isinstance(peer, str) else None
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


def client_address(request: Request) -> str:
    """The browser's address: forwarded by a trusted proxy (`ForwardedClient`), else the TCP peer."""
    return request.client.host if request.client is not None else "unknown"
