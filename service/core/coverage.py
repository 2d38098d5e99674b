"""Whether a stored grant answers a request without asking anyone: it covers the scopes, or it lacks only scopes
the provider refused before."""

from __future__ import annotations

from collections.abc import Sequence

from .identity import Identity
from .outcomes import NARROWED_BEFORE, AuthorizationOutcome, AuthorizationStatus, GrantInfo
from .ports import GrantRepo
from .records import GrantRecord


def covers(granted: Sequence[str], wanted: Sequence[str]) -> bool:
    """Whether a grant with `granted` scopes covers every scope in `wanted`."""
    return set(wanted) <= set(granted)


async def find_grant(grants: GrantRepo, user: Identity, provider: str, scopes: Sequence[str]) -> GrantRecord | None:
    """The newest grant of `user` at `provider` that covers every scope in `scopes`."""
    for grant in await grants.find(user, provider):
        if covers(grant.scopes, scopes):
            return grant
    return None


def settled_by(
    grants: Sequence[GrantRecord], provider: str, display_name: str, scopes: Sequence[str], *, ask_again: bool
) -> AuthorizationOutcome | None:
    """The answer `grants` (newest first) give to a request for `scopes`, or None: ALREADY_AUTHORIZED when one
    covers them; NARROWED when one lacks only scopes the provider refused when it was made (so asking again would
    ask the user the same thing), unless `ask_again`."""
    for grant in grants:
        if covers(grant.scopes, scopes):
            return AuthorizationOutcome(
                AuthorizationStatus.ALREADY_AUTHORIZED,
                provider,
                grant=GrantInfo.of(grant),
                provider_display_name=display_name,
            )
    for grant in () if ask_again else grants:
        missing = [scope for scope in scopes if scope not in grant.scopes]
        if set(missing) <= set(grant.refused_scopes):
            return AuthorizationOutcome(
                AuthorizationStatus.NARROWED,
                provider,
                grant=GrantInfo.of(grant),
                reason=NARROWED_BEFORE,
                provider_display_name=display_name,
                refused_scopes=tuple(missing),
            )
    return None
