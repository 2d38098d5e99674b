"""A grant's health: whether it can be used, and if not, why, in words safe for the user, the model and a log.

A grant is `active` while the connector can get a usable access token for it (refreshing when due). It is
`needs_user` once its provider refused the refresh for good (the user revoked the access, the refresh token
expired, or the provider answered for another account): the grant is kept (its account, scopes and metadata), is
never refreshed again, and asking for it starts a new authorization that says why. It is `expired` when its access
token has expired and it holds no refresh token (stored without `offline_access`): the user must authorize again,
but nothing went wrong. Reason codes are stable; each has one sentence, built from the provider's display name
only (never from anything the provider sent), so no reason sentence can carry a secret.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum


class GrantStatus(StrEnum):
    ACTIVE = "active"
    NEEDS_USER = "needs_user"
    EXPIRED = "expired"


class HealthReason(StrEnum):
    """Why a grant needs the user again (stable codes; `reason_sentence` says each in words)."""

    REVOKED = "revoked"  # the provider refused the refresh token (invalid_grant or its own "bad refresh token")
    ACCOUNT_CHANGED = "account_changed"  # a refresh answered for another account (the ID token's `sub` changed)
    NO_REFRESH_TOKEN = "no_refresh_token"  # noqa: S105 - a reason code. The access token expired and there is nothing to refresh it with
    KEY_REJECTED = "key_rejected"  # the provider answered 401 to a credential the user typed (an API key revoked)


def known_reason(value: str | None) -> HealthReason | None:
    """`value` as a reason code, or None when it is none this release knows."""
    try:
        return None if value is None else HealthReason(value)
    except ValueError:
        return None


_SENTENCES = {
    HealthReason.REVOKED: "{provider} access was revoked or has expired on {provider}'s side",
    HealthReason.ACCOUNT_CHANGED: "{provider} answered for another account than the one that was authorized",
    HealthReason.NO_REFRESH_TOKEN: "the {provider} access has expired and was granted without a way to renew it",
    HealthReason.KEY_REJECTED: "{provider} no longer accepts the key that was entered (it may have been revoked)",
}


def reason_sentence(reason: HealthReason | str | None, provider: str) -> str | None:
    """The sentence for `reason` at the provider shown as `provider`; None for no (or an unknown) reason."""
    known = known_reason(reason)
    return None if known is None else _SENTENCES[known].format(provider=provider)


def ask_again_message(reason: HealthReason | str | None, provider: str, scopes: str) -> str:
    """What an elicitation that heals a grant in `needs_user` says (the client shows it; so does the consent page)."""
    why = reason_sentence(reason, provider) or f"the {provider} access can no longer be used"
    return f"Authorize access to your {provider} account again ({scopes}): {why}."


@dataclass(frozen=True, slots=True)
class GrantHealth:
    """What is stored about a grant's health (all optional: a grant stored before health was kept is active)."""

    status: GrantStatus = GrantStatus.ACTIVE
    reason: HealthReason | None = None
    changed_at: datetime | None = None  # when it entered `status` (for needs_user)
    last_refresh_at: datetime | None = None  # the last refresh that succeeded
    last_failure_at: datetime | None = None  # the last refresh that failed (either way)
    next_attempt_at: datetime | None = None  # no refresh before this (a backoff after transient failures)
    failures: int = 0  # transient failures in a row since the last success

    @property
    def needs_user(self) -> bool:
        return self.status is GrantStatus.NEEDS_USER


@dataclass(frozen=True, slots=True)
class RefreshBackoff:
    """How long refreshes of one grant wait after transient failures in a row: jittered, doubling, bounded.

    The wait after the n-th failure in a row is drawn uniformly from [base·2^(n-1)/2, base·2^(n-1)], capped at
    `cap`; a provider's Retry-After is honoured when longer (and capped at `cap` too, against a provider asking
    for hours)."""

    base: timedelta = timedelta(seconds=2)
    cap: timedelta = timedelta(minutes=5)

    def wait(
        self, failures: int, retry_after: float | None = None, rand: Callable[[], float] = random.random
    ) -> timedelta:
        ceiling: timedelta = min(self.cap, self.base * (2 ** max(failures - 1, 0)))
        drawn: timedelta = ceiling * (0.5 + 0.5 * rand())
        if retry_after is not None:
            drawn = max(drawn, timedelta(seconds=max(retry_after, 0.0)))
        return min(drawn, self.cap)


@dataclass(frozen=True, slots=True)
class ProactivePolicy:
    """Which tokens are refreshed ahead (`service.tokens.proactive`): those of grants used within `used_within`
    seconds that expire within `ahead` seconds, looked for every `interval` seconds, `concurrency` at a time."""

    used_within: float
    ahead: float
    interval: float
    concurrency: int
