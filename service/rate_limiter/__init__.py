"""Counting requests against the rate limits, and the core's `AuditGate`: the budget of audit rows that requests
carrying no credential may cause.

`RateLimiter` counts over a moving window: in this process (`memory://`, `moving_window.LocalMovingWindow`,
which drops a key once its window has passed) or in Redis through the `limits` library (`rate_limit.storage_url`,
shared by every replica so that a limit holds across them). If the storage cannot
be reached, requests are let through (and the failure is logged): a rate limit must not take the service down.

`AuditBudget` bounds the audit rows that requests carrying no credential at all can cause (a forged CSRF token,
an unknown OAuth state, a wrong API key): `audit_per_address` per window for each client and `audit_total` for
all, then one `audit_suppressed` row for the rest of that window. It knows the client from `CURRENT_CLIENT`, which
the web layer sets for each request it serves.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

from limits import RateLimitItem, RateLimitItemPerSecond, WindowStats
from limits.aio.storage import Storage
from limits.aio.strategies import MovingWindowRateLimiter
from limits.storage import storage_from_string

from ..config import RateLimitSettings
from ..core.ports import AuditRepo
from .moving_window import LocalMovingWindow

log = logging.getLogger("service.web")  # its lines are about requests refused or let through

RouteGroup = Literal["connect", "callback", "confirm"]
KeyKind = Literal["address", "elicitation"]

AUDIT_SUPPRESSED = "audit_suppressed"

# The client address of the request being served (set by the web layer's `Front`), for `AuditBudget`.
CURRENT_CLIENT: ContextVar[str | None] = ContextVar("connector_client_address", default=None)


@dataclass(frozen=True, slots=True)
class Refusal:
    group: RouteGroup
    kind: KeyKind
    key: str
    retry_after: int  # whole seconds, at least 1


class MovingWindow(Protocol):
    """What the limiter asks of a moving window: limits' `MovingWindowRateLimiter`, or `LocalMovingWindow`."""

    async def hit(self, item: RateLimitItem, *identifiers: str, cost: int = 1) -> bool: ...

    async def get_window_stats(self, item: RateLimitItem, *identifiers: str) -> WindowStats: ...


def storage_uri(url: str) -> str:
    """The `limits` asyncio storage for `rate_limit.storage_url` (memory://, redis://, rediss://, ...)."""
    return f"async+{url}"


class RateLimiter:
    """The configured limits of each route group, counted in one storage over a moving window."""

    def __init__(self, settings: RateLimitSettings, *, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self._strategy: MovingWindow
        if settings.storage_url.partition("://")[0].strip().lower() == "memory":
            self._strategy = LocalMovingWindow(clock)
        else:
            storage = storage_from_string(storage_uri(settings.storage_url))
            assert isinstance(storage, Storage)
            self._strategy = MovingWindowRateLimiter(storage)
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
