"""Who is on the other end: the TCP peer, and the client address a trusted proxy forwarded.

Forwarded headers count only when the TCP peer is inside one of `server.trusted_proxies`. `ForwardedClient`
applies uvicorn's `ProxyHeadersMiddleware` rules with that list (the client is the nearest untrusted X-Forwarded-For
hop; the scheme comes from X-Forwarded-Proto), and adds the two things it does not do: it keeps the TCP peer
(identity verifiers must know whether the request came through a trusted proxy, which is the peer, not the
forwarded client), and it does not believe a forwarded "address" that is not an IP address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from functools import lru_cache

from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send
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


async def _scope_only(scope: Scope, receive: Receive, send: Send) -> None:
    """The app behind uvicorn's middleware here: it only rewrites the scope, which is all `ForwardedClient` wants."""


class ForwardedClient:
    """The client address behind trusted proxies (uvicorn's rules), the TCP peer kept in the scope: `apply(scope)`
    runs for every request before the app sees it (`service.web.front.Front`)."""

    def __init__(self, *, trusted_proxies: Sequence[str]) -> None:
        # Normalised: uvicorn reads "10.0.0.1/8" (host bits set) as a literal name, never as a network.
        trusted = [str(network) for network in _networks(tuple(trusted_proxies))]
        # Without a trusted proxy uvicorn's middleware changes nothing: it is not run then.
        self.forwarded = ProxyHeadersMiddleware(_scope_only, trusted_hosts=trusted) if trusted else None  # type: ignore[arg-type]

    async def apply(self, scope: Scope) -> None:
        client = scope.get("client")
        scope[PEER] = client[0] if client else None
        if self.forwarded is not None:
            await self.forwarded(scope, _no_receive, _no_send)  # type: ignore[arg-type]  # uvicorn's ASGI types
            client = scope.get("client")
        if client and not _is_ip(client[0]) and scope.get(PEER) is not None:
            scope["client"] = (scope[PEER], 0)  # a malformed forwarded hop is not believed


async def _no_receive() -> Message:
    raise RuntimeError("ForwardedClient reads no body")


async def _no_send(message: Message) -> None:
    raise RuntimeError("ForwardedClient sends nothing")


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
