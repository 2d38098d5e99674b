"""Whether a stored grant answers a request without asking anyone: it covers the scopes, or it lacks only scopes
the provider refused before."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from .accounts import choose
from .health import ask_again_message, reason_sentence
from .identity import Identity
from .outcomes import NARROWED_BEFORE, AuthorizationOutcome, AuthorizationStatus, GrantInfo
from .ports import GrantRepo
from .records import GrantRecord


def covers(granted: Sequence[str], wanted: Sequence[str]) -> bool:
    """Whether a grant with `granted` scopes covers every scope in `wanted`."""
    return set(wanted) <= set(granted)


async def find_grant(
    grants: GrantRepo,
    user: Identity,
    provider: str,
    scopes: Sequence[str],
    tenants: Collection[str],
    *,
    account: str | None = None,
    display_name: str | None = None,
) -> GrantRecord | None:
    """The newest grant of `user` at `provider` held by one of `tenants` that covers every scope in `scopes`, of the
    account `account` names (`accounts.choose`: AccountChoiceNeeded when it names none and the user holds several)."""
    chosen = choose(await grants.find(user, provider, tenants=tenants), account, display_name or provider)
    return newest_covering(chosen, scopes)


def newest_covering(grants: Sequence[GrantRecord], scopes: Sequence[str]) -> GrantRecord | None:
    """The first of `grants` (newest first) that covers every scope in `scopes`."""
    return next((grant for grant in grants if covers(grant.scopes, scopes)), None)


def settled_by(
    grants: Sequence[GrantRecord], provider: str, display_name: str, scopes: Sequence[str], *, ask_again: bool
) -> AuthorizationOutcome | None:
    """The answer `grants` (newest first) give to a request for `scopes`, or None: ALREADY_AUTHORIZED when one
    covers them; NARROWED when one lacks only scopes the provider refused when it was made (so asking again would
    ask the user the same thing), unless `ask_again`. A grant that needs the user again (`needs_user`) answers
    nothing: asking starts an elicitation that says why (`request_plan`)."""
    grants = [grant for grant in grants if not grant.health.needs_user]
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


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """What a new elicitation asks the provider for, and the message the client and the consent page show."""

    scopes: tuple[str, ...]
    message: str


def request_plan(
    grants: Sequence[GrantRecord], display_name: str, scopes: Sequence[str], message: str | None
) -> RequestPlan:
    """The elicitation a request for `scopes` that no stored grant settles starts. With a grant at the provider
    (the newest of `grants`): asked again for the union of its scopes and the new ones (incremental authorization:
    the result updates the same grant and loses no held scope), and its message says what is added, or, for a grant
    that needs the user, why it is asked again. `message` (the agent's) is kept, with that reason after it."""
    wanted = tuple(dict.fromkeys(scopes))
    if wanted == scopes:  # already a tuple without repeats: the same object, not a copy kept by every pending ask
        wanted = tuple(scopes)
    held = next(iter(grants), None)
    if held is None:
        return RequestPlan(wanted, message or default_message(display_name, wanted))
    union = tuple(dict.fromkeys((*held.scopes, *wanted)))
    if held.health.needs_user:
        why = reason_sentence(held.health.reason, display_name) or f"the {display_name} access can no longer be used"
        text = f"{message} ({why})" if message else ask_again_message(held.health.reason, display_name, _listed(union))
        return RequestPlan(union, text)
    added = [scope for scope in wanted if scope not in held.scopes]
    text = message or (
        f"Authorize more access to your {display_name} account: {_listed(added)}, "
        f"in addition to what it already granted ({_listed(held.scopes)})."
    )
    return RequestPlan(union, text)


def default_message(display_name: str, scopes: Sequence[str]) -> str:
    return f"Authorize access to your {display_name} account ({_listed(scopes)})."


def _listed(scopes: Sequence[str]) -> str:
    return ", ".join(scopes) if scopes else "basic access"
