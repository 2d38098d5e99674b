"""What `request_authorization` answers: a status, the grant's metadata (never a token), and a sentence.

The same outcomes serve the embedded API and the `/v1` API: one mapping from an elicitation's terminal state.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from .health import GrantStatus, HealthReason, reason_sentence
from .records import ElicitationRecord, GrantRecord
from .states import ElicitationStatus


class AuthorizationStatus(StrEnum):
    AUTHORIZED = "authorized"  # the user finished the flow in the browser; a grant covering the scopes is stored
    ALREADY_AUTHORIZED = "already_authorized"  # a stored grant covered the scopes; nothing was sent
    # A grant is stored, but without `refused_scopes` (refused at the provider). Answered again without asking when
    # the same scopes are requested, unless the agent passes ask_again=True.
    NARROWED = "narrowed"
    UNSUPPORTED = "unsupported"  # the client did not advertise URL-mode elicitation; nothing was sent
    DECLINED = "declined"  # the user declined, in the client, on the consent page or at the provider
    CANCELLED = "cancelled"  # a person dismissed it in the client, or the agent's work was cancelled
    REFUSED = "refused"  # the client refused it by its own policy (answered cancel with a reason: `client_message`)
    CLIENT_ERROR = "client_error"  # the client answered elicitation/create with an error or an unreadable answer
    DISCONNECTED = "disconnected"  # the ACP connection closed before the flow finished
    EXPIRED = "expired"  # the elicitation's time ran out before the flow finished
    FAILED = "failed"  # the provider refused or failed; `reason` says how


_SENTENCES: dict[AuthorizationStatus, str] = {
    AuthorizationStatus.AUTHORIZED: "Access to {provider} was granted.",
    AuthorizationStatus.ALREADY_AUTHORIZED: "Access to {provider} was already granted.",
    AuthorizationStatus.NARROWED: "Access to {provider} was granted without {refused}.",
    AuthorizationStatus.UNSUPPORTED: (
        "This client cannot open authorization links (it does not support URL-mode elicitation), "
        "so access to {provider} cannot be requested here."
    ),
    AuthorizationStatus.DECLINED: "The user declined access to {provider}.",
    AuthorizationStatus.CANCELLED: "The request for access to {provider} was dismissed.",
    AuthorizationStatus.REFUSED: "The client refused to show the request for access to {provider}.",
    AuthorizationStatus.CLIENT_ERROR: "The client refused the request for access to {provider}.",
    AuthorizationStatus.DISCONNECTED: "The client disconnected before access to {provider} was granted.",
    AuthorizationStatus.EXPIRED: "The request for access to {provider} expired before it was completed.",
    AuthorizationStatus.FAILED: "Authorization with {provider} failed.",
}

# Stable `failure_reason`s of a CANCELLED elicitation that map to their own outcome.
CLIENT_DISCONNECTED = "client_disconnected"
CLIENT_REFUSED = "client_refused"  # stored as "client_refused: <the client's message>"
# The reasons of a NARROWED outcome: just now at the provider, or at an earlier request (nothing was sent).
NARROWED_NOW = "refused at the provider"
NARROWED_BEFORE = "refused at the provider when the grant was made; not asked again (ask_again=True asks again)"


class StopCause(StrEnum):
    """Why the work waiting on an elicitation stopped before it had an outcome: how its cancellation is stored
    (`reason`, `event`), on the embedded path and through `/v1` alike."""

    AGENT = "agent"  # the agent's own code: a timeout, a task cancellation
    SESSION_CANCEL = "session_cancel"  # the client's session/cancel for the elicitation's session
    CLIENT_CANCEL_REQUEST = "client_cancel_request"  # the client's $/cancel_request for the request being served
    CLIENT_DISCONNECTED = CLIENT_DISCONNECTED

    @property
    def ends_the_work(self) -> bool:
        """The client stopped the work: it ends without resuming (`idle`). After the agent's own stop it goes on."""
        return self in (StopCause.SESSION_CANCEL, StopCause.CLIENT_CANCEL_REQUEST, StopCause.CLIENT_DISCONNECTED)

    @property
    def reason(self) -> str:
        """The cancelled elicitation's `failure_reason` (`client_disconnected` tells the `disconnected` outcome)."""
        return _STOP_REASONS[self]

    @property
    def event(self) -> str:
        """The audit event of the cancellation."""
        return CLIENT_DISCONNECTED if self is StopCause.CLIENT_DISCONNECTED else "cancelled"


_STOP_REASONS = {
    StopCause.AGENT: "the agent's work was cancelled",
    StopCause.SESSION_CANCEL: "the client cancelled the session's work",
    StopCause.CLIENT_CANCEL_REQUEST: "the client cancelled the request being served",
    StopCause.CLIENT_DISCONNECTED: CLIENT_DISCONNECTED,
}

TERMINAL_OUTCOMES: dict[ElicitationStatus, AuthorizationStatus] = {
    ElicitationStatus.COMPLETED: AuthorizationStatus.AUTHORIZED,
    ElicitationStatus.DECLINED: AuthorizationStatus.DECLINED,
    ElicitationStatus.CANCELLED: AuthorizationStatus.CANCELLED,
    ElicitationStatus.EXPIRED: AuthorizationStatus.EXPIRED,
    ElicitationStatus.FAILED: AuthorizationStatus.FAILED,
}


@dataclass(frozen=True, slots=True)
class GrantInfo:
    """What an agent may know about a grant: never the token. `status` is its health (`service.core.health`):
    `active`, `needs_user` (with `reason`) or `expired`; the times say when it was last refreshed, when a refresh
    last failed, and when the next one may be tried (after transient failures)."""

    id: str
    provider: str
    account_id: str
    scopes: tuple[str, ...]
    token_expires_at: datetime | None
    status: GrantStatus = GrantStatus.ACTIVE
    reason: HealthReason | None = None
    last_refresh_at: datetime | None = None
    last_failure_at: datetime | None = None
    next_refresh_at: datetime | None = None
    # Which account (`service.core.accounts`): the label the user gave it (else its profile name), the provider's name.
    account_label: str | None = None
    account_name: str | None = None

    @classmethod
    def of(cls, grant: GrantRecord, now: datetime | None = None) -> GrantInfo:
        status, reason = grant.status_at(now if now is not None else datetime.now(UTC))
        health = grant.health
        return cls(
            grant.id,
            grant.provider,
            grant.provider_account_id,
            grant.scopes,
            grant.token_expires_at,
            status=status,
            reason=reason,
            last_refresh_at=health.last_refresh_at,
            last_failure_at=health.last_failure_at,
            next_refresh_at=health.next_attempt_at,
            account_label=grant.account_label,
            account_name=grant.account_name,
        )

    def describe_health(self, display_name: str | None = None) -> str | None:
        """Why the grant is not active, in a sentence safe for the user and the model (None when it is)."""
        return reason_sentence(self.reason, display_name or self.provider)


@dataclass(frozen=True, slots=True)
class AuthorizationOutcome:
    status: AuthorizationStatus
    provider: str  # the catalog name
    elicitation_id: str | None = None
    grant: GrantInfo | None = None
    reason: str | None = None
    error_code: int | None = None  # the JSON-RPC error code, for CLIENT_ERROR
    client_message: str | None = None  # the client's own reason, for REFUSED (length-capped, sanitised)
    provider_display_name: str | None = None  # what people are shown; the catalog name when unset
    refused_scopes: tuple[str, ...] = ()  # for NARROWED: the scopes asked for that the grant lacks

    @property
    def ok(self) -> bool:
        """A grant covering every scope asked for exists (NARROWED is not ok: look at `granted_scopes`)."""
        return self.status in (AuthorizationStatus.AUTHORIZED, AuthorizationStatus.ALREADY_AUTHORIZED)

    @property
    def granted_scopes(self) -> tuple[str, ...]:
        """The scopes of the stored grant (empty when there is none)."""
        return self.grant.scopes if self.grant is not None else ()

    def describe(self) -> str:
        """A sentence safe to show the user or the model."""
        text = _SENTENCES[self.status].format(
            provider=self.provider_display_name or self.provider, refused=", ".join(self.refused_scopes)
        )
        detail = f"the client said: {self.client_message}" if self.client_message else self.reason
        return f"{text} ({detail})" if detail and not self.ok else text


def ended_outcome(
    record: ElicitationRecord,
    status: AuthorizationStatus,
    display_name: str,
    grant: GrantInfo | None = None,
    reason: str | None = None,
    error_code: int | None = None,
    client_message: str | None = None,
) -> AuthorizationOutcome:
    """The outcome of `record`, ended in `status`; AUTHORIZED becomes NARROWED when `grant` lacks a scope asked."""
    refused: tuple[str, ...] = ()
    if status is AuthorizationStatus.AUTHORIZED and grant is not None:
        refused = tuple(scope for scope in record.scopes if scope not in grant.scopes)
        if refused:
            status, reason = AuthorizationStatus.NARROWED, NARROWED_NOW
    return AuthorizationOutcome(
        status,
        record.provider,
        record.id,
        grant=grant,
        reason=reason,
        error_code=error_code,
        client_message=client_message,
        provider_display_name=display_name,
        refused_scopes=refused,
    )


def terminal_status(record: ElicitationRecord) -> AuthorizationStatus:
    """The outcome status of an elicitation that has ended."""
    if record.status is ElicitationStatus.CANCELLED:
        if record.failure_reason == CLIENT_DISCONNECTED:
            return AuthorizationStatus.DISCONNECTED
        if refusal_message(record.failure_reason) is not None:
            return AuthorizationStatus.REFUSED
    return TERMINAL_OUTCOMES.get(record.status, AuthorizationStatus.FAILED)


def refusal_reason(client_message: str) -> str:
    """The stored reason of an elicitation the client refused, with the client's (already sanitised) message."""
    return f"{CLIENT_REFUSED}: {client_message}"


def refusal_message(reason: str | None) -> str | None:
    """The client's message in a stored refusal reason, or None when `reason` is not a refusal."""
    prefix = f"{CLIENT_REFUSED}: "
    return reason[len(prefix) :] if reason is not None and reason.startswith(prefix) else None
