"""Putting a mock provider on a transport: in-process through a respx router, or a Starlette app on loopback.

`MockServing` is mixed into `MockOAuthProvider`: it needs `base_url`, `handle(MockRequest)`, `_answer_lost`,
`refresh_delay` and `response_delay` from it.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx

from .mock_http import MockRequest, MockResponse, first_values

if TYPE_CHECKING:
    import respx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response


# Token requests whose answer leaves `refresh_delay` late: a refresh, a legacy token's exchange (RFC 8693).
_DELAYED_GRANTS = ("refresh_token", "urn:ietf:params:oauth:grant-type:token-exchange")


class MockServing:
    base_url: str
    refresh_delay: float
    response_delay: float

    def handle(self, request: MockRequest) -> MockResponse:
        raise NotImplementedError

    def _routes(self) -> Mapping[tuple[str, str], object]:
        """(method, path) of each endpoint, for `install`."""
        raise NotImplementedError

    def _answer_lost(self, request: MockRequest, answer: MockResponse) -> bool:
        raise NotImplementedError

    def _timed_out(self, request: MockRequest) -> bool:
        """Whether this request gets no answer at all (an outage); none by default."""
        return False

    def _relative_path(self, path: str) -> str:
        prefix = urlsplit(self.base_url).path.rstrip("/")
        return path[len(prefix) :] if prefix and path.startswith(prefix) else path

    # -- respx adapter (in-process) --------------------------------------------------------------------
    def install(self, router: respx.MockRouter) -> None:
        """Route this provider's endpoints through `router`: httpx calls to `base_url` never leave the process."""
        for method, path in self._routes():
            router.request(method, f"{self.base_url}{path}").mock(side_effect=self._respx)

    def _respx(self, request: httpx.Request) -> httpx.Response:
        mock_request = MockRequest(
            method=request.method,
            path=self._relative_path(request.url.path),
            query=first_values(request.url.query.decode()),
            headers={k.lower(): v for k, v in request.headers.items()},
            body=request.content,
        )
        if self._timed_out(mock_request):
            raise httpx.ReadTimeout("the provider did not answer", request=request)
        answer = self.handle(mock_request)
        if self._answer_lost(mock_request, answer):
            raise httpx.ReadTimeout("the provider's answer was lost", request=request)
        return httpx.Response(answer.status, headers=dict(answer.headers), content=answer.body)

    # -- ASGI adapter (another process can reach it) -----------------------------------------------------
    def asgi_app(self) -> Starlette:
        """A Starlette app serving this provider's endpoints (paths relative to `base_url`'s path)."""
        from starlette.applications import Starlette
        from starlette.responses import Response
        from starlette.routing import Route

        async def endpoint(request: Request) -> Response:
            mock_request = MockRequest(
                method=request.method,
                path=self._relative_path(request.url.path),
                query=dict(request.query_params),
                headers={k.lower(): v for k, v in request.headers.items()},
                body=await request.body(),
            )
            if self._timed_out(mock_request):
                await asyncio.Event().wait()  # never answer: the client's timeout ends the call
            answer = self.handle(mock_request)
            if self._answer_lost(mock_request, answer):
                await asyncio.Event().wait()  # never answer: the client's timeout ends the call
            if self.refresh_delay and answer.status == 200:
                if mock_request.params().get("grant_type") in _DELAYED_GRANTS:
                    await asyncio.sleep(self.refresh_delay)
            if self.response_delay:
                await asyncio.sleep(self.response_delay)
            return Response(answer.body, status_code=answer.status, headers=dict(answer.headers))

        return Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST"])])

    @asynccontextmanager
    async def serve_http(self, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
        """Serve over HTTP on loopback (port 0: any free port) while the block runs; yields the new `base_url`.

        `base_url` (and so `catalog_entry()`) points at the server from then on, e.g. http://127.0.0.1:54321.
        Accepted connections have TCP_NODELAY set, so a client reusing its connection is not slowed down.
        """
        from service.web.server import serving

        with self._listening_socket(host, port) as sock:
            async with serving(self.asgi_app(), sock):
                yield self.base_url

    def _listening_socket(self, host: str, port: int) -> socket.socket:
        """Bind on loopback (refusing any other address) and point `base_url` at it."""
        from service.core.urls import is_loopback_host
        from service.web.server import listening_socket

        if not is_loopback_host(host):
            raise ValueError(f"the mock provider serves on loopback only, not on {host!r}")
        sock = listening_socket(host, port)
        bound_port = sock.getsockname()[1]
        self.base_url = f"http://{f'[{host}]' if sock.family == socket.AF_INET6 else host}:{bound_port}"
        return sock

    async def serve_forever(self, host: str = "127.0.0.1", port: int = 0, *, on_ready: Callable[[str], None]) -> None:
        """Serve until the server stops (Ctrl-C) or the task is cancelled; `on_ready(base_url)` once listening."""
        from service.web.server import serving

        sock = self._listening_socket(host, port)
        with sock:
            async with serving(self.asgi_app(), sock) as running:
                on_ready(self.base_url)
                await running.stopped()
