"""What the web layer hands to identity verifiers' routes (`service.identity.RouteKit`), and reading requests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from ..core.errors import FlowRefused
from ..core.verification import BrowserFacts, IdentityStep
from .client_address import peer_address, peer_is_trusted
from .errors import describe
from .inputs import read_json_object
from .ratelimit import RateLimitGuard
from .security import BrowserBinding


def browser_facts(request: Request, trusted_proxies: Sequence[str]) -> BrowserFacts:
    """What a verifier may know about the request: every header value by lower-cased name, and the TCP peer."""
    headers: dict[str, tuple[str, ...]] = {}
    for name, value in request.headers.items():
        headers[name] = (*headers.get(name, ()), value)
    return BrowserFacts(
        headers=headers, peer=peer_address(request), peer_trusted=peer_is_trusted(request, trusted_proxies)
    )


def api_error(exc: FlowRefused, **extra: Any) -> JSONResponse:
    """The JSON answer for a refused API call: {"error": {"code", "message"}, ...extra}."""
    refusal, text = describe(exc, for_api=True)
    headers = {"WWW-Authenticate": 'Bearer realm="acp-connector"'} if refusal.status == 401 else {}
    if "retry_after" in exc.detail:
        headers["Retry-After"] = exc.detail["retry_after"]
    error: dict[str, Any] = {"code": exc.code, "message": text}
    if exc.labels:
        error["labels"] = list(exc.labels)
    return JSONResponse({"error": error, **extra}, refusal.status, headers=headers)


class Kit:
    """`service.identity.RouteKit` for the configured verifier's routes."""

    def __init__(
        self, step: IdentityStep, binding: BrowserBinding, guard: RateLimitGuard, trusted_proxies: Sequence[str]
    ) -> None:
        self._step = step
        self._binding = binding
        self._guard = guard
        self._trusted = tuple(trusted_proxies)

    @property
    def step(self) -> IdentityStep:
        return self._step

    def binding(self, request: Request) -> str | None:
        return self._binding.read(request)

    def browser(self, request: Request) -> BrowserFacts:
        return browser_facts(request, self._trusted)

    def redirect(self, url: str) -> Response:
        return RedirectResponse(url, status_code=303)

    def json(self, body: dict[str, Any]) -> Response:
        return JSONResponse(body)

    async def read_json(self, request: Request) -> dict[str, Any]:
        return await read_json_object(request)

    async def limit(self, request: Request, key: str) -> Response | None:
        return await self._guard.check_elicitation(request, "confirm", key)

    def api_error(self, exc: FlowRefused, **extra: str) -> Response:
        return api_error(exc, **extra)
