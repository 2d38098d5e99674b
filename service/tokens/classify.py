"""What a failed refresh means: the user must authorize again, the provider is unavailable for now, or it refused.

Only a definitive answer about the grant itself makes it `needs_user`: an OAuth error the provider's catalog
entry lists as a dead refresh token (RFC 6749 `invalid_grant` by default; GitHub's `bad_refresh_token`, which
comes with HTTP 200), or a refresh whose ID token names another account. A 5xx, a 429, a timeout or no connection
is transient. Anything else the provider refuses (`invalid_client`, an unreadable answer) is our side's problem,
not the user's: the grant stays active and refreshes back off, as for a transient failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from service.core.errors import EndpointError, IdTokenError, ProviderError
from service.core.health import HealthReason
from service.oauth import ResolvedProvider

# OAuth error codes that say "try later" (RFC 6749 §4.1.2.1 names temporarily_unavailable; some token endpoints
# answer it, or slow_down, RFC 8628 §3.5).
_LATER = frozenset({"temporarily_unavailable", "slow_down"})


class Kind(StrEnum):
    NEEDS_USER = "needs_user"
    UNAVAILABLE = "unavailable"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class Verdict:
    """How a refresh failed: `kind`, and `reason` (a `HealthReason` for needs_user, else a metrics reason)."""

    kind: Kind
    reason: str
    retry_after: float | None = None


def classify(exc: ProviderError, provider: ResolvedProvider) -> Verdict:
    """The verdict on a refresh of a grant at `provider` that raised `exc`."""
    if isinstance(exc, IdTokenError):
        if exc.check == "sub":
            return Verdict(Kind.NEEDS_USER, HealthReason.ACCOUNT_CHANGED.value)
        return Verdict(Kind.REJECTED, "bad_answer")
    if not isinstance(exc, EndpointError):
        return Verdict(Kind.REJECTED, "bad_answer")
    if exc.error is not None and exc.error in provider.dead_refresh_token_errors:
        return Verdict(Kind.NEEDS_USER, HealthReason.REVOKED.value)
    if exc.error in _LATER:
        return Verdict(Kind.UNAVAILABLE, "oauth_error", exc.retry_after)
    if exc.status == 429:
        return Verdict(Kind.UNAVAILABLE, "http_429", exc.retry_after)
    if exc.status is not None and exc.status >= 500:
        return Verdict(Kind.UNAVAILABLE, "http_5xx", exc.retry_after)
    if exc.status is None:
        return Verdict(Kind.UNAVAILABLE, "timeout" if exc.timed_out else "connection")
    return Verdict(Kind.REJECTED, "oauth_error" if exc.error is not None else "bad_answer")


def classify_migration(exc: ProviderError, provider: ResolvedProvider) -> Verdict:
    """The verdict on a legacy grant's migration (token exchange) that raised `exc`: as a refresh's, and a 401 that
    names an OAuth error other than `invalid_client` refused the subject token itself (the grant is dead). A bare
    401, or `invalid_client`, may be our own client's fault: it backs off, never marking every grant needs_user."""
    if isinstance(exc, EndpointError) and exc.status == 401 and exc.error not in (None, "invalid_client"):
        return Verdict(Kind.NEEDS_USER, HealthReason.REVOKED.value)
    return classify(exc, provider)
