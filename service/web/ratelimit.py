"""Rate limits on the browser-facing routes: token buckets per client address and per elicitation.

`RateLimiter` holds the buckets (in this process only: with several replicas each one counts for itself).
`RateLimitGuard` turns a refusal into the 429 answer (Retry-After, error code `rate_limited`) and one
`rate_limited` audit event per key and window. `RateLimit` is the ASGI middleware that applies the guard to
the connect, callback and confirm routes by path; a handler that learns the elicitation only from its body
(the confirm endpoint) calls `RateLimitGuard.check_elicitation` itself.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ..config import RateLimitSettings
from ..core.ports import AuditRepo
from ..metrics import Metrics
from .client_address import client_address
from .pages import Pages

log = logging.getLogger("service.web")

RouteGroup = Literal["connect", "callback", "confirm"]
KeyKind = Literal["address", "elicitation"]

RATE_LIMITED = "rate_limited"
MAX_KEYS = 100_000  # buckets kept at most; idle (full) ones are dropped first


@dataclass(frozen=True, slots=True)
class Refusal:
    group: RouteGroup
    kind: KeyKind
    key: str
    retry_after: int  # whole seconds, at least 1


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


class TokenBuckets:
    """Buckets of `capacity` tokens refilled at `capacity / window` per second, one per key."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, max_keys: int = MAX_KEYS) -> None:
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: OrderedDict[tuple[str, ...], _Bucket] = OrderedDict()

    def take(self, key: tuple[str, ...], capacity: int, window: float) -> float | None:
        """Take one token: None if there was one, else the seconds until there will be."""
        now = self._clock()
        rate = capacity / window
        bucket = self._buckets.get(key)
        if bucket is None:
            self._make_room(now, rate, capacity)
            bucket = _Bucket(float(capacity), now)
            self._buckets[key] = bucket
        else:
            bucket.tokens = min(float(capacity), bucket.tokens + (now - bucket.updated) * rate)
            bucket.updated = now
            self._buckets.move_to_end(key)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return (1.0 - bucket.tokens) / rate

    def __len__(self) -> int:
        return len(self._buckets)

    def _make_room(self, now: float, rate: float, capacity: int) -> None:
        if len(self._buckets) < self._max_keys:
            return
        # Drop buckets that have refilled completely (forgetting them changes nothing), then the least recent.
        full = [k for k, b in self._buckets.items() if b.tokens + (now - b.updated) * rate >= capacity]
        for k in full:
            del self._buckets[k]
        while len(self._buckets) >= self._max_keys:
            self._buckets.popitem(last=False)


class RateLimiter:
    """The configured limits of each route group, checked against one set of buckets."""

    def __init__(self, settings: RateLimitSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.buckets = TokenBuckets(clock=clock)
        self._clock = clock
        self._audited: dict[tuple[str, ...], float] = {}

    def limit(self, group: RouteGroup, kind: KeyKind) -> int:
        value = getattr(self.settings, f"{group}_per_{kind}")
        assert isinstance(value, int)
        return value

    def hit(self, group: RouteGroup, kind: KeyKind, key: str) -> Refusal | None:
        """Count one request of `group` for `key`; a Refusal when its bucket is empty."""
        if not self.settings.enabled:
            return None
        wait = self.buckets.take((group, kind, key), self.limit(group, kind), float(self.settings.window_seconds))
        if wait is None:
            return None
        return Refusal(group, kind, key, max(1, math.ceil(wait)))

    def should_audit(self, refusal: Refusal) -> bool:
        """True for the first refusal of a key in each window: a flood writes one audit row, not thousands."""
        now = self._clock()
        key = (refusal.group, refusal.kind, refusal.key)
        last = self._audited.get(key)
        if last is not None and now - last < self.settings.window_seconds:
            return False
        if len(self._audited) >= MAX_KEYS:
            horizon = now - self.settings.window_seconds
            self._audited = {k: t for k, t in self._audited.items() if t >= horizon}
        self._audited[key] = now
        return True


class RateLimitGuard:
    """Checks a request against the limiter and builds the 429 answer; shared by the middleware and handlers."""

    def __init__(
        self,
        limiter: RateLimiter,
        *,
        trusted_proxies: Sequence[str],
        audit: AuditRepo,
        pages: Pages,
        now: Callable[[], datetime],
        metrics: Metrics | None = None,
    ) -> None:
        self.limiter = limiter
        self.metrics = metrics
        self.trusted_proxies = tuple(trusted_proxies)
        self.audit = audit
        self.pages = pages
        self.now = now

    async def check_address(self, request: Request, group: RouteGroup) -> Response | None:
        """Count the request for its client address; the 429 response when over the limit."""
        address = client_address(request, self.trusted_proxies)
        return await self._refuse(request, self.limiter.hit(group, "address", address), address=address)

    async def check_elicitation(
        self, request: Request, group: RouteGroup, key: str, *, elicitation_id: str | None = None
    ) -> Response | None:
        """Count the request for one elicitation (or one OAuth state, `key`); the 429 response when over."""
        refusal = self.limiter.hit(group, "elicitation", key)
        if refusal is None:
            return None
        address = client_address(request, self.trusted_proxies)
        return await self._refuse(request, refusal, address=address, elicitation_id=elicitation_id)

    async def _refuse(
        self, request: Request, refusal: Refusal | None, *, address: str, elicitation_id: str | None = None
    ) -> Response | None:
        if refusal is None:
            return None
        if self.metrics is not None:
            self.metrics.rate_limit_refused(refusal.group, refusal.kind)
        if self.limiter.should_audit(refusal):
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


def route_group(method: str, path: str) -> RouteGroup | None:
    if _CONNECT.match(path) and method in ("GET", "POST"):
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
    """ASGI middleware: applies `RateLimitGuard` to the connect, callback and confirm routes."""

    def __init__(self, app: ASGIApp, *, guard: RateLimitGuard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        group = route_group(scope["method"], path)
        if group is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refused = await self.guard.check_address(request, group)
        if refused is None:
            if group == "connect":
                match = _CONNECT.match(path)
                elicitation_id = (match.group("id") if match else None) or request.query_params.get("elicitationId")
                if elicitation_id:
                    # Ids come from the URL: anything not shaped like one is keyed by its hash and not audited.
                    plausible = _ID_SHAPE.fullmatch(elicitation_id) is not None
                    refused = await self.guard.check_elicitation(
                        request,
                        group,
                        elicitation_id if plausible else _digest(elicitation_id),
                        elicitation_id=elicitation_id if plausible else None,
                    )
            elif group == "callback":
                query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
                state = (query.get("state") or [""])[0]
                if state:
                    refused = await self.guard.check_elicitation(request, group, _digest(state))
        if refused is not None:
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)
