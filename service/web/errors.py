"""Domain error codes as HTTP: the status, the page title and the sentence a person reads, in one table.

The domain raises `FlowRefused(code, detail=...)`; this table is the only place that turns a code into a status
and words. A sentence may name a `detail` value (`{error}`, `{message}`, `{problem}`); a missing one reads as "".
Codes not in the table are provider failures by default (502) when they start with `provider_`, else 400.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..core.errors import FlowRefused


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    title: str
    sentence: str
    # How a request ended (connected, declined, cancelled) rather than something wrong: its page shows no
    # error reference.
    outcome: bool = False
    # The message of a JSON answer under /v1 when it differs from what a person in the browser reads.
    api_sentence: str | None = None


_START_AGAIN = "Open the link from the agent again."

REFUSALS: dict[str, Refusal] = {
    # The elicitation itself.
    "unknown_elicitation": Refusal(404, "Link not found", "This authorization link is not known here."),
    "already_completed": Refusal(
        409,
        "Already connected",
        "You are connected: this link was already used to connect your account, and there is nothing more to "
        "do. You can close this tab.",
        outcome=True,
    ),
    "declined": Refusal(
        410,
        "Request declined",
        "This authorization request was declined. Ask the agent again if you change your mind.",
        outcome=True,
    ),
    "cancelled": Refusal(
        410,
        "Request cancelled",
        "The agent withdrew this request, so there is nothing to do here. You can close this tab.",
        outcome=True,
    ),
    "expired": Refusal(410, "Link expired", "This authorization link has expired. Ask the agent to start again."),
    "failed": Refusal(
        410,
        "Request failed",
        "This authorization request failed and can no longer be used. Ask the agent to start again.",
    ),
    # The browser and the consent form.
    "identity_mismatch": Refusal(
        403,
        "Different account",
        "This link was started by a different account. Sign in as the user who asked the agent, "
        "or ask the agent to start again as yourself.",
    ),
    "not_your_link": Refusal(
        403,
        "This link is not for you",
        "This link is not for you: it was started for a different account, so it cannot be declined from here. "
        "Nothing was changed. You can close this tab.",
    ),
    "browser_mismatch": Refusal(
        403, "Different browser", "This must be finished in the browser where the link was opened."
    ),
    "csrf_failed": Refusal(
        403, "Form expired", "This form could not be verified. Reload the link from the agent and try again."
    ),
    "bad_action": Refusal(400, "Invalid request", "Choose Continue or Decline."),
    "bad_request": Refusal(400, "Invalid request", "The request is not valid: {problem}."),
    "invalid_input": Refusal(400, "Invalid request", "The request is not valid: {problem}."),
    "body_too_large": Refusal(
        413, "Request too large", "The request body is larger than this address accepts ({limit} bytes)."
    ),
    "unsupported_media_type": Refusal(415, "Unsupported request", "This address accepts only {expected} bodies."),
    "rate_limited": Refusal(429, "Slow down", "Too many requests. Wait a moment and try again."),
    "not_found": Refusal(404, "Not found", "There is nothing at this address."),
    "method_not_allowed": Refusal(405, "Method not allowed", "There is nothing at this address."),
    "internal_error": Refusal(500, "Something went wrong", "The connector hit an internal error. Try the link again."),
    "database_busy": Refusal(
        503,
        "Busy",
        "The connector is too busy to finish this step right now. Try again in a moment.",
        api_sentence="The connector's database was busy and this request did not finish; retry after Retry-After.",
    ),
    # The credential form (an API key typed on the connector's page).
    "credential_form_invalid": Refusal(
        400, "Form not open", "This form is not open for this browser. Open the agent's link again to start over."
    ),
    "credential_form_used": Refusal(
        400, "Already submitted", "This form was already submitted. If you just connected, you are done."
    ),
    "credential_form_expired": Refusal(
        400, "Took too long", "The form was open too long. Open the agent's link again to start over."
    ),
    # The provider's answer.
    "missing_state": Refusal(400, "Invalid request", "The provider's answer carries no state."),
    "unknown_state": Refusal(400, "Invalid request", "This authorization answer does not match any request."),
    "provider_mismatch": Refusal(400, "Invalid request", "This answer came back from the wrong provider."),
    "state_used": Refusal(
        400,
        "Link already used",
        "This authorization answer was already used. If you just connected, you are done and can close "
        "this tab; otherwise start again from the agent's link.",
    ),
    "state_expired": Refusal(
        400, "Took too long", "The sign-in at the provider took too long. Open the agent's link again to start over."
    ),
    "issuer_mismatch": Refusal(400, "Invalid response", "The answer did not come from the expected provider."),
    "access_denied": Refusal(
        400, "Access not granted", "You did not grant access at the provider. Nothing was stored."
    ),
    "provider_error": Refusal(
        400, "Provider error", f"The provider reported a problem ({{error}}) and nothing was connected. {_START_AGAIN}"
    ),
    "missing_code": Refusal(400, "Invalid request", "The answer carries no authorization code."),
    "provider_token_error": Refusal(
        502,
        "Provider error",
        f"The provider's answer could not be used ({{message}}), so nothing was connected. {_START_AGAIN}",
        api_sentence="{message}",
    ),
    "provider_callback_error": Refusal(
        502,
        "Provider error",
        f"The provider's answer lacks something it should carry ({{message}}), so nothing was connected. "
        f"{_START_AGAIN}",
        api_sentence="{message}",
    ),
    # Per-connection values the agent gives at request_authorization (a tenant, a shop's subdomain).
    "missing_connection_value": Refusal(
        400, "Invalid request", "The request lacks a value the provider needs ({name}).", api_sentence="{message}"
    ),
    "invalid_connection_value": Refusal(
        400, "Invalid request", "A value given for the provider is not usable ({name}).", api_sentence="{message}"
    ),
    # Several accounts per provider (service.core.accounts).
    "invalid_account_label": Refusal(
        400,
        "Account name not accepted",
        "The name for the account is not accepted: {problem}. Go back, change it (or leave it empty) and continue.",
    ),
    "invalid_account": Refusal(400, "Invalid request", "The account named is not usable: {problem}."),
    "account_choice_needed": Refusal(
        409,
        "Account choice needed",
        "The user holds several accounts at this provider ({labels}): name the one meant with 'account'.",
    ),
    "unknown_account": Refusal(
        403,
        "Not authorized",
        "The user holds no grant for this account at this provider: create an elicitation with this 'account' to "
        "let the user add it.",
    ),
    "provider_discovery_failed": Refusal(
        502,
        "Provider unavailable",
        "The provider's settings could not be read right now ({message}). Try the link again in a few minutes.",
    ),
    # The detail of these two names settings: for a developer calling /v1, not for the person in the browser.
    "provider_not_configured": Refusal(
        503,
        "Provider unavailable",
        "This connector is not set up for that provider yet, so nothing can be connected. Tell whoever runs the agent.",
        api_sentence="{message}",
    ),
    "unknown_provider": Refusal(
        404,
        "Unknown provider",
        "This connector does not know that provider, so nothing can be connected. Tell whoever runs the agent.",
        api_sentence="{message}",
    ),
    # The identity step.
    "unknown_verification": Refusal(
        400, "Invalid request", "This sign-in answer does not match any sign-in started here."
    ),
    "verification_used": Refusal(400, "Link already used", f"This sign-in answer was already used. {_START_AGAIN}"),
    "verification_expired": Refusal(400, "Sign-in expired", f"This sign-in took too long. {_START_AGAIN}"),
    "untrusted_identity_header": Refusal(
        403,
        "Request refused",
        "This request names a user in its headers but did not come through the sign-in proxy, so it is refused.",
    ),
    "not_signed_in": Refusal(
        403,
        "Not signed in",
        "This connector learns who you are from its sign-in proxy, and this request did not say. "
        "Open the link through the proxy's address and sign in.",
    ),
    "ambiguous_identity": Refusal(
        403, "Request refused", "The sign-in proxy named more than one user for this request, so it is refused."
    ),
    "bad_identity_header": Refusal(
        400, "Request refused", "The sign-in proxy sent an identity this connector cannot read."
    ),
    "idp_unavailable": Refusal(
        503,
        "Sign-in unavailable",
        "The identity provider cannot be reached right now. Try the link again in a moment.",
    ),
    "idp_token_error": Refusal(
        502,
        "Sign-in failed",
        f"The sign-in at the identity provider could not be completed. {_START_AGAIN}",
    ),
    "id_token_invalid": Refusal(
        403,
        "Sign-in not accepted",
        f"The identity provider's answer could not be verified, so nothing was done. {_START_AGAIN}",
    ),
    "sign_in_failed": Refusal(
        403, "Sign-in failed", f"The identity provider did not sign you in ({{error}}). {_START_AGAIN}"
    ),
    # The operator's confirm API.
    "unauthorized": Refusal(401, "Unauthorized", "A valid API key is required (Authorization: Bearer)."),
    # The operator console (/admin).
    "operator_unauthorized": Refusal(
        401,
        "Sign-in required",
        "The operator console needs an operator: sign in at /admin/login, or send the operator API key "
        "(Authorization: Bearer).",
    ),
    "operator_forbidden": Refusal(
        403, "Not for agents", "An agent's API key does not open the operator console: use the operator API key."
    ),
    "operator_not_allowed": Refusal(
        403,
        "Not an operator",
        "You signed in, but you are not among the console's operators: ask whoever runs the connector to add you.",
    ),
    "operator_csrf_failed": Refusal(
        403, "Form expired", "This form could not be verified: go back, reload the page and try again."
    ),
    "operator_sign_in_failed": Refusal(
        403, "Sign-in failed", "The sign-in could not be completed ({reason}): start again at /admin/login."
    ),
    "confirm_required": Refusal(400, "Not confirmed", "Confirm the action on its page first."),
    # Operations.
    "metrics_unauthorized": Refusal(
        401, "Unauthorized", "The metrics need the metrics bearer token (Authorization: Bearer)."
    ),
    "unknown_flow": Refusal(404, "Unknown flow", "No hand-off with this flow id is known."),
    "flow_used": Refusal(
        409, "Flow already used", "This flow id was already confirmed; each flow id is good for one confirmation."
    ),
    "flow_expired": Refusal(
        410, "Flow expired", "This flow id has expired; the user must open the link from the agent again."
    ),
    # The agents' `/v1` API.
    "provider_not_allowed": Refusal(403, "Provider not allowed", "This API key may not use this provider."),
    "idempotency_conflict": Refusal(
        409,
        "Idempotency key reused",
        "This idempotency key was used for a different request; use a new key for a new elicitation.",
    ),
    "already_answered": Refusal(
        409, "Already answered", "The client's answer for this elicitation was reported before."
    ),
    "already_ended": Refusal(409, "Already ended", "This elicitation has already ended."),
    "unknown_grant": Refusal(404, "Unknown grant", "No grant with this id is known to this API key."),
    "no_grant": Refusal(
        403,
        "Not authorized",
        "The user holds no grant at this provider: create an elicitation and let the user authorize first.",
    ),
    "grant_unusable": Refusal(
        403, "Not authorized", "The user's grant can no longer be used; the user must authorize again."
    ),
    "grant_needs_user": Refusal(
        403,
        "Authorization needed again",
        "The user must authorize again ({reason}): {sentence}. Creating an elicitation for the provider asks them.",
    ),
    "provider_unavailable": Refusal(
        503,
        "Provider unavailable",
        "The provider could not renew the access token just now; nothing changed. Try again after Retry-After.",
    ),
    "grant_unreadable": Refusal(
        503,
        "Grant unreadable",
        "The user's grant cannot be decrypted with this connector's vault keys, so nothing was sent to the provider: "
        "the operator's to fix (the connector's log names the grant and its key).",
    ),
    "proxy_not_available": Refusal(404, "No API to proxy", "This provider has no API base URL to proxy to."),
    "proxy_path_refused": Refusal(400, "Path refused", "The path must stay under the provider's API base URL."),
    "upstream_unavailable": Refusal(502, "Provider unavailable", "The provider's API could not be reached."),
    "upstream_timeout": Refusal(504, "Provider timed out", "The provider's API did not answer in time."),
    "webhook_url_refused": Refusal(400, "Webhook URL refused", "This URL cannot receive webhooks: {problem}."),
    "webhook_limit": Refusal(
        409, "Too many webhooks", "This API key's agent has as many webhook endpoints as allowed."
    ),
    "unknown_webhook": Refusal(404, "Unknown webhook", "No webhook endpoint with this id is known to this API key."),
}

_PROVIDER_FAILURE = Refusal(
    502,
    "Provider error",
    f"The provider could not complete the sign-in ({{message}}), so nothing was connected. {_START_AGAIN}",
)
_OTHER = Refusal(400, "Invalid request", "This request cannot be served.")


class _Blank(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return ""


def refusal_of(code: str) -> Refusal:
    known = REFUSALS.get(code)
    if known is not None:
        return known
    if code.startswith(("provider_", "invalid_id_token", "not_refreshable")):
        return _PROVIDER_FAILURE
    return _OTHER


def sentence(code: str, detail: Mapping[str, str] | None = None, *, for_api: bool = False) -> str:
    refusal = refusal_of(code)
    text = refusal.api_sentence if for_api and refusal.api_sentence is not None else refusal.sentence
    return text.format_map(_Blank(detail or {})).strip()


def describe(exc: FlowRefused, *, for_api: bool = False) -> tuple[Refusal, str]:
    """The status and title for `exc`, and its sentence (for a page, or the JSON answer of `/v1`) with its detail
    filled in."""
    return refusal_of(exc.code), sentence(exc.code, exc.detail, for_api=for_api)
