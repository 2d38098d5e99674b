"""Rate limits on the browser-facing routes, counted by the `limits` library: per client address and per
elicitation, over a moving window, in memory (one process) or in Redis (`rate_limit.storage_url`, shared by
every replica so that a limit holds across them).

`RateLimiter` counts. `RateLimitGuard` turns a refusal into the 429 answer (Retry-After, error code
`rate_limited`) and one `rate_limited` audit event per key and window. `RateLimit` (asked by the `Front` middleware)
applies the guard, for every method, to the connect, callback and confirm routes by path; `Front` also makes the
client address known to `AuditBudget` for the request (`CURRENT_CLIENT`). A handler that learns the elicitation
only from its body (the confirm endpoint) calls `RateLimitGuard.check_elicitation` itself.

`AuditBudget` bounds the audit rows that requests carrying no credential at all can cause (a forged CSRF token,
an unknown OAuth state, a wrong API key): `audit_per_address` per window for each client and `audit_total` for
all, then one `audit_suppressed` row for the rest of that window.

If the storage cannot be reached, requests are let through (and the failure is logged): a rate limit must not
take the service down with it.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from urllib.parse import parse_qs

from limits import RateLimitItem, RateLimitItemPerSecond
from limits.aio.storage import Storage
from limits.aio.strategies import MovingWindowRateLimiter
from limits.storage import storage_from_string
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Scope

from ..config import RateLimitSettings
from ..core.ports import AuditRepo
from ..metrics import Metrics
from .client_address import client_address
from .pages import Pages

log = logging.getLogger("service.web")

RouteGroup = Literal["connect", "callback", "confirm"]
KeyKind = Literal["address", "elicitation"]

RATE_LIMITED = "rate_limited"
AUDIT_SUPPRESSED = "audit_suppressed"

# The client address of the request being served (set by `Front`), for `AuditBudget`.
CURRENT_CLIENT: ContextVar[str | None] = ContextVar("connector_client_address", default=None)


@dataclass(frozen=True, slots=True)
class Refusal:
    group: RouteGroup
    kind: KeyKind
    key: str
    retry_after: int  # whole seconds, at least 1


def storage_uri(url: str) -> str:
    """The `limits` asyncio storage for `rate_limit.storage_url` (memory://, redis://, rediss://, ...)."""
    return f"async+{url}"


class RateLimiter:
    """The configured limits of each route group, counted in one storage over a moving window."""

    def __init__(self, settings: RateLimitSettings, *, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        storage = storage_from_string(storage_uri(settings.storage_url))
        assert isinstance(storage, Storage)
        self.storage = storage
        self._strategy = MovingWindowRateLimiter(self.storage)
        self._clock = clock
        self._once = self.per_window(1)
        self._warned_at = -math.inf

    def per_window(self, amount: int) -> RateLimitItem:
        return RateLimitItemPerSecond(amount, self.settings.window_seconds, namespace="connector")

    def limit(self, group: RouteGroup, kind: KeyKind) -> int:
        value = getattr(self.settings, f"{group}_per_{kind}")
        assert isinstance(value, int)
        return value

    async def hit(self, group: RouteGroup, kind: KeyKind, key: str) -> Refusal | None:
        """Count one request of `group` for `key`; a Refusal when the window is full."""
        if not self.settings.enabled:
            return None
        item = self.per_window(self.limit(group, kind))
        if await self.take(item, group, kind, key):
            return None
        try:
            stats = await self._strategy.get_window_stats(item, group, kind, key)
            wait = stats.reset_time - self._clock()
        except Exception as exc:  # the storage went away between the two calls
            self._storage_failed(exc)
            wait = float(self.settings.window_seconds)
        return Refusal(group, kind, key, max(1, math.ceil(wait)))

    async def take(self, item: RateLimitItem, *key: str) -> bool:
        """Count one hit of `item` for `key`: True while within the limit, and whenever the storage fails."""
        try:
            return await self._strategy.hit(item, *key)
        except Exception as exc:
            self._storage_failed(exc)
            return True

    def _storage_failed(self, exc: Exception) -> None:
        """Log that the storage failed (and requests pass), once a minute at most: not once per request."""
        now = time.monotonic()
        if now - self._warned_at >= 60:
            self._warned_at = now
            log.warning("rate limit storage failed, letting requests through: %s: %s", type(exc).__name__, exc)

    async def first_in_window(self, *key: str) -> bool:
        """True once per window for `key`: a flood is recorded once, not thousands of times."""
        return await self.take(self._once, "once", *key)


class AuditBudget:
    """Bounds the audit rows requests without any credential cause: see the module's first lines.

    Implements `service.core.ports.AuditGate`; outside a request (no client address known) it admits everything.
    It holds with `rate_limit.enabled = false` too: turning request limits off does not unbound the audit table.
    """

    def __init__(self, limiter: RateLimiter, audit: AuditRepo, now: Callable[[], datetime]) -> None:
        self.limiter = limiter
        self.audit = audit
        self.now = now

    async def admit(self, event: str) -> bool:
        client = CURRENT_CLIENT.get()
        settings = self.limiter.settings
        if client is None:
            return True
        over = None
        if not await self.limiter.take(self.limiter.per_window(settings.audit_per_address), "audit", client):
            over = client
        elif not await self.limiter.take(self.limiter.per_window(settings.audit_total), "audit", "*"):
            over = "*"
        if over is None:
            return True
        if await self.limiter.first_in_window("audit-suppressed", over):
            await self.audit.record(
                AUDIT_SUPPRESSED,
                detail={
                    "client_address": over,
                    "first_suppressed": event,
                    "window_seconds": settings.window_seconds,
                },
                now=self.now(),
            )
        return False


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
_CONNECT = re.compile(r"^/connect(?:/(?P<id>[^/]+))?/?$")
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
