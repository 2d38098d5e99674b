"""Every audit event the connector records, with what it means: the one registry of their names.

A new event is added here first (docs/reference.md is generated from this table). Recording a name that is not
here still works, but warns with `UnregisteredAuditEvent`, which the test suite turns into an error.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from types import MappingProxyType


class UnregisteredAuditEvent(UserWarning):
    """An audit event whose name is not in `AUDIT_EVENTS`."""


_EVENTS: dict[str, str] = {
    # The life of an elicitation.
    "created": "The agent asked for authorization: an elicitation was created (detail: scopes, scope kind).",
    "consented": "The client answered accept: the user agreed to open the link.",
    "opened": "The connect page was opened in a browser.",
    "verified": "The identity verifier confirmed that the person in the browser is the bound user.",
    "completed": "The provider's answer was redeemed and the grant stored; the elicitation is complete.",
    "completed_after_cancel": "The user finished at the provider after the request was cancelled: the grant is "
    "stored, nothing is resumed.",
    "declined": "The user declined, in the client, on the consent page or at the provider.",
    "cancelled": "The request was withdrawn (the agent's work was cancelled) or dismissed in the client.",
    "refused": "The client refused the request by its own policy (a cancel with a reason, kept in the detail).",
    "client_error": "The client answered elicitation/create with a JSON-RPC error or an answer that cannot be read.",
    "client_disconnected": "The ACP connection closed before the client answered.",
    "unsupported_client": "The client did not advertise URL-mode elicitation: nothing was sent.",
    "expired": "The elicitation's time ran out before it finished.",
    "completion_sent": "elicitation/complete was sent on the originating connection.",
    "completion_undeliverable": "The elicitation completed but its originating connection was gone: "
    "elicitation/complete was not sent.",
    # The browser and the consent form.
    "browser_mismatch": "A step came from another browser than the one the link was opened in.",
    "csrf_failed": "The consent form's CSRF token did not verify.",
    "decline_refused": "Someone other than the bound user tried to decline the link: refused, nothing changed.",
    "rate_limited": "A client went over a rate limit (once per key and window).",
    "audit_suppressed": "More requests without any credential than audit_per_address or audit_total allow in a "
    "window: their audit rows are left out from here (once per window).",
    # The credential form (an API key typed on the connector's page; values are never in the detail).
    "credential_malformed": "A credential typed on the form failed its format check (detail: which fields).",
    "credential_refused": "The provider's check request refused a credential typed on the form: nothing stored.",
    "credential_rejected": "The provider answered 401 to a stored credential in use: the grant needs the user.",
    "credential_unchecked": "The provider did not answer a credential's check request (in time): nothing stored.",
    # The identity step.
    "identity_challenge": "The identity verifier sent the browser to sign in first.",
    "identity_mismatch": "The person in the browser is not the bound user: the link stays open for the right one.",
    "identity_locked": "Too many identity mismatches: the elicitation failed as locked.",
    "identity_confirmed": "The operator's application confirmed its signed-in user (confirm verifier).",
    "confirm_unauthorized": "A call to the confirm API had no valid API key.",
    "untrusted_identity_header": "A request named a user in identity headers but did not come from a trusted proxy.",
    "identity_header_ambiguous": "The sign-in proxy named more than one user.",
    "identity_header_invalid": "The sign-in proxy sent an identity that cannot be read.",
    "identity_missing": "The sign-in proxy named no user.",
    "unknown_verification": "A sign-in answer matched no sign-in started here.",
    "verification_expired": "A sign-in took too long.",
    "verification_unconfirmed": "A sign-in hand-off was used before it was confirmed.",
    "idp_error": "The identity provider answered the sign-in with an error.",
    "idp_issuer_mismatch": "The identity provider's answer named another issuer (RFC 9207).",
    "idp_unavailable": "The identity provider (or its signing keys) could not be reached.",
    "id_token_invalid": "The identity provider's ID token failed a check (detail: which one).",
    # The provider's answer.
    "unknown_state": "A callback's state matched no authorization request.",
    "state_expired": "A callback came after the authorization request's time.",
    "replay_attempt": "A single-use value (state, sign-in answer) was used again.",
    "provider_mismatch": "A callback came back to another provider's address.",
    "issuer_mismatch": "The provider's answer named another issuer (RFC 9207 iss).",
    "provider_error": "The provider answered with an error, or redeeming the code failed (detail: the error).",
    # Using and removing grants.
    "refreshed": "An access token was refreshed.",
    "refresh_failed": (
        "Refreshing an access token failed (detail: the error code, the verdict: needs_user, unavailable or "
        "rejected, and for the last two the failures in a row and the backoff)."
    ),
    "token_migrated": (
        "A legacy grant's non-expiring access token was exchanged for an expiring one and a refresh token "
        "(the provider's `legacy_token_exchange`), at its use or by `acp-connector grants migrate` (detail: the "
        "grant)."
    ),
    "token_migration_failed": (
        "Migrating a legacy grant's non-expiring token failed (detail: the error code, the verdict: needs_user, "
        "unavailable or rejected, and for the last two the failures in a row and the backoff)."
    ),
    "grant_needs_user": (
        "The provider refused a grant for good: it is kept, never refreshed again, and needs the user to authorize "
        "again (detail: the grant and the reason code: revoked, account_changed, key_rejected)."
    ),
    "grant_recovered": "The user authorized again: a grant that needed the user is active (detail: the grant).",
    "disconnected": "A grant was revoked (where the provider allows) and deleted.",
    # Operations.
    "keys_rotated": (
        "Grants and webhook signing secrets were re-encrypted under the primary vault key "
        "(`acp-connector keys rotate`)."
    ),
    "grants_migrated": (
        "`acp-connector grants migrate` ran over the legacy grants (detail: the providers, how many were "
        "migrated, found migrated already, need the user, or failed for now)."
    ),
    "key_retired": "A vault key that no longer encrypts anything was retired (`acp-connector keys retire`).",
    "api_key_created": "An API key for the /v1 API was created (`acp-connector api-keys create`).",
    "api_key_revoked": "An API key for the /v1 API was revoked (`acp-connector api-keys revoke`).",
    "webhook_created": "A webhook endpoint was registered for a tenant (detail: its id, the tenant, how: api or cli).",
    "webhook_deleted": "A webhook endpoint was removed with its deliveries (detail: its id, the tenant, how).",
    "operator_signed_in": "An operator signed in to the console (detail: the operator, the issuer and subject).",
    "operator_sign_in_refused": (
        "Someone signed in at the operators' identity provider who is not among admin.allowed_users or "
        "admin.allowed_groups: refused (detail: who)."
    ),
    "operator_signed_out": "An operator signed out of the console (detail: the operator).",
    "webhook_secret_rotated": (
        "A webhook endpoint's signing secret was replaced; the previous one signs too until the overlap ends "
        "(detail: its id, the tenant, how, the overlap in seconds)."
    ),
}

AUDIT_EVENTS: Mapping[str, str] = MappingProxyType(_EVENTS)


def checked_event(name: str) -> str:
    """`name`, warning with `UnregisteredAuditEvent` when it is not in `AUDIT_EVENTS`."""
    if name not in AUDIT_EVENTS:
        warnings.warn(
            f"audit event {name!r} is not registered: add it to service/core/audit_events.py",
            UnregisteredAuditEvent,
            stacklevel=3,
        )
    return name
