"""Rate limits on the browser-facing routes: which requests count, and the 429 answer of one over its limit.

`RateLimitGuard` turns a refusal of the `RateLimiter` (`service/rate_limiter.py`, which counts) into the 429 answer
(Retry-After, error code `rate_limited`) and one `rate_limited` audit event per key and window. `RateLimit` (asked
by the `Front` middleware) applies the guard, for every method, to the connect, callback and confirm routes by
path; `Front` also makes the client address known to `AuditBudget` for the request (`CURRENT_CLIENT`). A handler
that learns the elicitation only from its body (the confirm endpoint) calls `RateLimitGuard.check_elicitation`
itself.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from datetime import datetime
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Scope

from ..core.ports import AuditRepo
from ..metrics import Metrics
from ..rate_limiter import RateLimiter, Refusal, RouteGroup
from .client_address import client_address
from .pages import Pages

RATE_LIMITED = "rate_limited"


class RateLimitGuard:
    """Checks a request against the limiter and builds the 429 answer; shared by the middleware and handlers."""

    def __init__(
        self,
        limiter: RateLimiter,
        *,
        audit: AuditRepo,
        pages: Pages,
        now: Callable[[], datetime],
        metrics: Metrics | None = None,
    ) -> None:
        self.limiter = limiter
        self.metrics = metrics
        self.audit = audit
        self.pages = pages
        self.now = now

    async def check_address(self, request: Request, group: RouteGroup) -> Response | None:
        """Count the request for its client address; the 429 response when over the limit."""
        address = client_address(request)
        return await self._refuse(request, await self.limiter.hit(group, "address", address), address=address)

    async def check_elicitation(
        self, request: Request, group: RouteGroup, key: str, *, elicitation_id: str | None = None
    ) -> Response | None:
        """Count the request for one elicitation (or one OAuth state, `key`); the 429 response when over."""
        refusal = await self.limiter.hit(group, "elicitation", key)
        if refusal is None:
            return None
        return await self._refuse(request, refusal, address=client_address(request), elicitation_id=elicitation_id)

    async def _refuse(
        self, request: Request, refusal: Refusal | None, *, address: str, elicitation_id: str | None = None
    ) -> Response | None:
        if refusal is None:
            return None
        if self.metrics is not None:
            self.metrics.rate_limit_refused(refusal.group, refusal.kind)
        if await self.limiter.first_in_window(RATE_LIMITED, refusal.group, refusal.kind, refusal.key):
            await self.audit.record(
                RATE_LIMITED,
                elicitation_id=elicitation_id,
                detail={
                    "route": refusal.group,
                    "limit": refusal.kind,
                    "client_address": address,
                    "retry_after": refusal.retry_after,
                },
                now=self.now(),
            )
        return self.response(request, refusal)

    def response(self, request: Request, refusal: Refusal) -> Response:
        text = "Too many requests. Wait a moment and try again."
        headers = {"Retry-After": str(refusal.retry_after), "X-Connector-Error": RATE_LIMITED}
        if request.url.path.startswith("/v1/"):
            return JSONResponse({"error": {"code": RATE_LIMITED, "message": text}}, status_code=429, headers=headers)
        page = self.pages.message(request, 429, "Slow down", text, code=RATE_LIMITED)
        page.headers["Retry-After"] = headers["Retry-After"]
        return page


# Which requests are limited, and what identifies their elicitation. The callback's elicitation is known only
# through its `state`, so the per-elicitation bucket of a callback is keyed by (a hash of) the state.
_CONNECT = re.compile(r"^/connect(?:/(?P<id>[^/]+)(?:/credentials)?)?/?$")
# The provider callbacks, and the identity verifiers' browser routes (e.g. the oidc sign-in callback).
_CALLBACK = re.compile(r"^/(?:callback/[^/]+|identity/[^/]+/[^/]+)/?$")
# The identity verifiers' API routes (e.g. the operator's confirm call).
_CONFIRM = re.compile(r"^/v1/identity/[^/]+(?:/.*)?$")


def route_group(path: str) -> RouteGroup | None:
    """The limited group of a path, whatever the method (a HEAD or OPTIONS request counts like a GET)."""
    if _CONNECT.match(path):
        return "connect"
    if _CALLBACK.match(path):
        return "callback"
    if _CONFIRM.match(path):
        return "confirm"
    return None


_ID_SHAPE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _digest(value: str) -> str:
    return hashlib.sha256(b"rate-limit-key\x00" + value.encode()).hexdigest()[:32]


class RateLimit:
    """Applies `RateLimitGuard` to the connect, callback and confirm routes (`Front` asks it for every request)."""

    def __init__(self, guard: RateLimitGuard) -> None:
        self.guard = guard

    async def check(self, request: Request, scope: Scope) -> Response | None:
        """The 429 answer when the request is over a limit, else None (and the request is counted)."""
        path: str = scope["path"]
        group = route_group(path)
        if group is None:
            return None
        refused = await self.guard.check_address(request, group)
        if refused is not None:
            return refused
        if group == "connect":
            match = _CONNECT.match(path)
            elicitation_id = (match.group("id") if match else None) or request.query_params.get("elicitationId")
            if elicitation_id:
                # Ids come from the URL: anything not shaped like one is keyed by its hash and not audited.
                plausible = _ID_SHAPE.fullmatch(elicitation_id) is not None
                return await self.guard.check_elicitation(
                    request,
                    group,
                    elicitation_id if plausible else _digest(elicitation_id),
                    elicitation_id=elicitation_id if plausible else None,
                )
        elif group == "callback":
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            state = (query.get("state") or [""])[0]
            if state:
                return await self.guard.check_elicitation(request, group, _digest(state))
        return None
