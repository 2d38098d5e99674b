"""Identity routes: where a redirecting verifier finishes, and the operator's confirm endpoint.

- `GET /identity/oidc/callback` (oidc): the operator's identity provider sends the browser back here.
- `POST /v1/identity/confirm` (confirm): the operator's app, with `Authorization: Bearer <api key>`, says which
  of its users is logged in for a flow id; JSON in, JSON out.
- `GET /identity/confirm/return` (confirm): the browser comes back from the operator's app.

Only the routes of the configured verifier exist. Each return continues to the provider on success.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from ..flow import FlowError
from ..identity.base import BrowserFacts
from ..identity.confirm import CONFIRM_PATH, RETURN_PATH, ConfirmVerifier
from ..identity.oidc import CALLBACK_PATH, OidcVerifier
from .client_address import peer_address, peer_is_trusted

if TYPE_CHECKING:
    from .browser import BrowserRoutes

MAX_CONFIRM_BODY = 8192


def browser_facts(request: Request, trusted_proxies: Sequence[str]) -> BrowserFacts:
    """What a verifier may know about the request: every header value by lower-cased name, and the TCP peer."""
    headers: dict[str, tuple[str, ...]] = {}
    for name, value in request.headers.items():
        headers[name] = (*headers.get(name, ()), value)
    return BrowserFacts(
        headers=headers, peer=peer_address(request), peer_trusted=peer_is_trusted(request, trusted_proxies)
    )


def api_error(status_code: int, code: str, message: str, **extra: Any) -> JSONResponse:
    headers = {"WWW-Authenticate": 'Bearer realm="acp-connector"'} if status_code == 401 else None
    return JSONResponse({"error": {"code": code, "message": message}, **extra}, status_code, headers=headers)


class IdentityRoutes:
    def __init__(self, browser: BrowserRoutes) -> None:
        self.browser = browser
        self.connector = browser.connector
        self.step = browser.identity
        self.pages = browser.pages
        self.binding = browser.binding

    def routes(self) -> list[Route]:
        verifier = self.connector.verifier
        if isinstance(verifier, OidcVerifier):
            return [Route(CALLBACK_PATH, self.oidc_callback, methods=["GET"])]
        if isinstance(verifier, ConfirmVerifier):
            return [
                Route(CONFIRM_PATH, self.confirm, methods=["POST"]),
                Route(RETURN_PATH, self.confirm_return, methods=["GET"]),
            ]
        return []

    async def oidc_callback(self, request: Request) -> Response:
        params = dict(request.query_params.items())
        try:
            url = await self.step.finish_oidc(params, self.binding.read(request))
        except FlowError as exc:
            return self.pages.error(request, exc)
        return RedirectResponse(url, status_code=303)

    async def confirm_return(self, request: Request) -> Response:
        try:
            url = await self.step.finish_confirm(request.query_params.get("code"), self.binding.read(request))
        except FlowError as exc:
            return self.pages.error(request, exc)
        return RedirectResponse(url, status_code=303)

    async def confirm(self, request: Request) -> Response:
        verifier = self.connector.verifier
        assert isinstance(verifier, ConfirmVerifier)
        if not verifier.authenticate(request.headers.get("authorization")):
            await self.connector.runtime.store.audit.record(
                "confirm_unauthorized",
                detail={"peer": peer_address(request)},
                now=self.connector.runtime.now(),
            )
            return api_error(401, "unauthorized", "A valid operator API key is required (Authorization: Bearer).")
        body = await _json_body(request)
        if body is None:
            return api_error(
                400, "bad_request", 'Send a JSON object {"flow_id": "...", "user_id": "..."} (at most 8 KiB).'
            )
        flow_id, user_id = body.get("flow_id"), body.get("user_id")
        if set(body) != {"flow_id", "user_id"} or not isinstance(flow_id, str) or not isinstance(user_id, str):
            return api_error(400, "bad_request", 'The body must be exactly {"flow_id": "...", "user_id": "..."}.')
        guard = getattr(request.app.state, "rate_limits", None)  # per flow id; the middleware limits per address
        if guard is not None:
            key = "confirm-flow:" + hashlib.sha256(flow_id.encode()).hexdigest()
            limited: Response | None = await guard.check_elicitation(request, "confirm", key)
            if limited is not None:
                return limited
        try:
            answer = await self.step.confirm(flow_id, user_id)
        except FlowError as exc:
            return api_error(exc.status_code, exc.code, exc.message)
        if answer.error is not None:
            # The browser's next stop shows the refusal page; it says nothing about whom.
            return api_error(403, answer.error.code, answer.error.message, next_uri=answer.next_uri)
        return JSONResponse({"status": "confirmed", "next_uri": answer.next_uri})


async def _json_body(request: Request) -> dict[str, Any] | None:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_CONFIRM_BODY):
        return None
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_CONFIRM_BODY:
            return None
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None
