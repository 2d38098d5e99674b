"""The `/v1` API's bodies as pydantic models: the handlers validate and answer with these, and the OpenAPI
document is generated from them. Requests refuse unknown fields; field names are camelCase on the wire."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.alias_generators import to_camel

from service.core.health import GrantStatus, HealthReason
from service.core.outcomes import AuthorizationStatus
from service.core.states import DeliveryStatus, ElicitationStatus

# Printable text of bounded length: what reaches the store and the logs can never be a NUL or a megabyte.
Text255 = Annotated[str, StringConstraints(min_length=1, max_length=255, pattern=r"^[^\x00-\x1f\x7f]+$")]
Text512 = Annotated[str, StringConstraints(min_length=1, max_length=512, pattern=r"^[^\x00-\x1f\x7f]+$")]
ScopeName = Annotated[str, StringConstraints(min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$")]
ProviderName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,62}$")]
RequestId = Annotated[int, Field(ge=-(2**53) + 1, le=2**53 - 1)] | Text255


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class _Request(_Model):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=False, frozen=True, extra="forbid", strict=True
    )


class User(_Request):
    """The user the agent acts for, as the agent verified them: the same issuer and subject the connector's
    identity verifier will see in the browser."""

    issuer: Text512
    subject: Text512


class Scope(_Request):
    """Where the elicitation belongs on the agent's ACP connection: `sessionId` (+ `toolCallId`) or `requestId`."""

    session_id: Text255 | None = None
    tool_call_id: Text255 | None = None
    request_id: RequestId | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Scope:
        if (self.session_id is None) == (self.request_id is None):
            raise ValueError("give either sessionId (with an optional toolCallId) or requestId")
        if self.tool_call_id is not None and self.session_id is None:
            raise ValueError("toolCallId belongs to a sessionId")
        return self


class CreateElicitation(_Request):
    user: User
    provider: ProviderName
    scopes: Annotated[list[ScopeName], Field(max_length=50)] | None = Field(
        default=None, description="Scopes to ask for; the provider's default scopes when omitted."
    )
    scope: Scope
    message: Annotated[str, StringConstraints(min_length=1, max_length=1000)] | None = Field(
        default=None, description="What the client shows the user; a sentence naming the provider when omitted."
    )
    connection_id: Text255 | None = Field(
        default=None, description="The agent's own label for the ACP connection; events carry it back."
    )
    connection: (
        Annotated[
            dict[Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_]{0,31}$")], Text255], Field(max_length=10)
        ]
        | None
    ) = Field(
        default=None,
        description="Per-connection values the provider's catalog entry asks of the agent (e.g. a shop's "
        "`subdomain`, a Microsoft `tenant`); a missing or malformed one is refused with "
        "`missing_connection_value` / `invalid_connection_value` naming it.",
    )
    account: Text255 | None = Field(
        default=None,
        description="Which of the user's accounts at the provider is meant: the provider's account id (`accountId` "
        "of a grant) or its label (`accountLabel`, or the provider's name for it, `accountName`), without regard to "
        "case. Without it, a user holding several accounts there is refused `account_choice_needed` (409, naming "
        "them in `error.labels`). An account the user does not hold yet creates an elicitation for a new one: the "
        "provider is asked to let the user pick the account, and the consent page offers this as its name.",
    )
    ask_again: bool = Field(
        default=False,
        description="Ask the user even when a stored grant lacks only scopes the provider refused before "
        "(without it, such a request is answered `narrowed` at once).",
    )
    grants_only: bool = Field(
        default=False,
        description="Answer from stored grants only (`already_authorized`, `narrowed`, else `needs_user`) and "
        "create nothing: for a client that cannot be asked, or to look before asking.",
    )
    url_mode: bool = Field(
        default=True,
        description="False: the agent's ACP client did not advertise URL-mode elicitation. Nothing is created: "
        "stored grants alone answer (as with `grantsOnly`), else `unsupported`, recorded in the audit log as "
        "the embedded connector records it.",
    )


class Answer(_Request):
    """How the client answered `elicitation/create`: `accept` (consent to open the URL only), `decline`,
    `cancel`, `client_error` with the JSON-RPC error code it sent, or `disconnected` (no answer came)."""

    action: Literal["accept", "decline", "cancel", "client_error", "disconnected"]
    code: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] | None = None
    message: Annotated[str, StringConstraints(max_length=500)] | None = Field(
        default=None,
        description="With `cancel`: the client's own reason (its `_meta.message`), which makes the answer a refusal "
        "by the client's policy (outcome `refused`, the reason kept) rather than a person dismissing it. With "
        "`client_error`: the error's message.",
    )

    @model_validator(mode="after")
    def _code_for_errors(self) -> Answer:
        if self.action == "client_error" and self.code is None:
            raise ValueError("client_error needs the JSON-RPC error code")
        if self.action != "client_error" and self.code is not None:
            raise ValueError("code belongs to client_error only")
        if self.action not in ("client_error", "cancel") and self.message is not None:
            raise ValueError("message belongs to cancel (the client's reason) and client_error only")
        return self


class Cancel(_Request):
    """Why the agent cancels (optional: without a body, `agent`). Stored as on the embedded path, so that a client
    that disconnected reads `disconnected` in the elicitation's outcome, events and audit."""

    cause: Literal["agent", "session_cancel", "client_cancel_request", "client_disconnected"] = Field(
        default="agent",
        description="`agent`: the agent's own work stopped (a timeout, a task cancelled); `session_cancel`: the "
        "client sent session/cancel; `client_cancel_request`: the client sent $/cancel_request for the request "
        "being served; `client_disconnected`: the client's ACP connection closed.",
    )
    request_cancelled: bool | None = Field(
        default=None, description="Whether the agent withdrew its outstanding elicitation/create ($/cancel_request)."
    )


class Grant(_Model):
    """What an agent may know about a grant: never a token."""

    grant_id: str
    provider: str
    account_id: str = Field(description="The provider's id of the account (`account` names it; one grant each).")
    account_label: str | None = Field(
        default=None,
        description="The name the user gave the account on the consent page (e.g. work), else the provider's name "
        "for it; unique among the user's accounts at the provider. None for a grant stored before labels.",
    )
    account_name: str | None = Field(
        default=None, description="The provider's own name for the account (a login or e-mail address), if it gave one."
    )
    scopes: list[str]
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None = Field(description="When the current access token expires (it is refreshed).")
    needs_user_again: bool = Field(
        default=False,
        description="Stored without a refresh token although offline_access was asked: when the access token "
        "expires (`expiresAt`), the user must authorize again.",
    )
    status: GrantStatus = Field(
        default=GrantStatus.ACTIVE,
        description="active: usable; needs_user: the provider refused it for good (`reason`), the user must "
        "authorize again (creating an elicitation for it says why); expired: its access token expired and it has "
        "no refresh token.",
    )
    reason: HealthReason | None = Field(default=None, description="Why it is not active: a stable code.")
    reason_text: str | None = Field(default=None, description="Why it is not active, in a sentence for people.")
    last_refresh_at: datetime | None = Field(default=None, description="The last refresh that succeeded.")
    last_failure_at: datetime | None = Field(default=None, description="The last refresh that failed.")
    next_refresh_at: datetime | None = Field(
        default=None, description="After transient failures: no refresh is tried before this time."
    )
    connection: dict[str, str] = Field(
        default_factory=dict,
        description="The grant's per-connection values (a tenant, a shop's subdomain, an instance URL, a company "
        "id): given by the agent, or read from the provider's callback or token response. Secret ones are left out.",
    )


class ElicitationState(_Model):
    elicitation_id: str
    status: ElicitationStatus
    outcome: AuthorizationStatus | None = Field(
        description="Set once the elicitation has ended. The answer to a client_error report says `client_error`."
    )
    reason: str | None
    provider: str
    provider_display_name: str = Field(description="What the user is shown for the provider.")
    scopes: list[str]
    url: str = Field(description="Send this as the `url` of a URL-mode `elicitation/create`.")
    message: str
    session_id: str | None
    tool_call_id: str | None
    request_id: int | str | None
    connection_id: str | None
    answered: bool = Field(description="Whether the client's answer was reported.")
    created_at: datetime
    expires_at: datetime
    grant: Grant | None = Field(description="The grant, once the elicitation completed.")
    refused_scopes: list[str] = Field(
        default_factory=list, description="With outcome `narrowed`: the scopes asked for that the provider refused."
    )


class Created(_Model):
    """`created`: send `elicitation/create` with these values. `already_authorized`: a grant covers the scopes.
    `narrowed`: a grant lacks only `refusedScopes`, which the provider refused when it was made; nothing is asked
    (send `askAgain: true` to ask the user again). `needs_user` (only with `grantsOnly`): no grant settles the
    request, and nothing was created. `unsupported` (only with `urlMode: false`): no grant settles it, and the
    client cannot be asked; nothing was created."""

    status: Literal["created", "already_authorized", "narrowed", "needs_user", "unsupported"]
    provider_display_name: str
    elicitation_id: str | None = None
    url: str | None = None
    message: str | None = None
    expires_at: datetime | None = None
    elicitation: ElicitationState | None = None
    grant: Grant | None = None
    refused_scopes: list[str] = Field(default_factory=list)


class GrantList(_Model):
    grants: list[Grant]


class Event(_Model):
    """One event of the stream (also the body of a webhook): an elicitation reached `status`."""

    id: int
    elicitation_id: str
    status: ElicitationStatus
    outcome: AuthorizationStatus | None
    connection_id: str | None


class CreateWebhook(_Request):
    """A webhook endpoint for this API key's agent: each of its events is POSTed there, signed."""

    url: Annotated[str, StringConstraints(min_length=1, max_length=2048)] = Field(
        description="https only; no credentials or fragment; a public address (see `webhooks.allow_private_addresses`)."
    )
    description: Text255 | None = None


class Webhook(_Model):
    """A webhook endpoint (never its secret)."""

    webhook_id: str
    url: str
    description: str | None
    created_at: datetime


class WebhookCreated(Webhook):
    """The new endpoint, with its signing secret: shown this once, keep it (it verifies `webhook-signature`; a
    Standard Webhooks library takes it as it is)."""

    secret: str = Field(description="`whsec_` + base64; the HMAC-SHA256 key is the base64-decoded part.")


class RotateWebhookSecret(_Request):
    """A new signing secret for the endpoint; the current one keeps signing (a second signature) for the overlap."""

    overlap_seconds: Annotated[int, Field(ge=0, le=7 * 24 * 3600)] = Field(
        default=24 * 3600,
        description="How long the current secret keeps signing alongside the new one (0: not at all; at most "
        "7 days; default 24 hours). A previous secret still in its overlap is dropped.",
    )


class WebhookSecretRotated(WebhookCreated):
    """The endpoint with its new signing secret: shown this once. Until `previousSecretExpiresAt` each delivery's
    `webhook-signature` holds two signatures, `v1,<new> v1,<previous>`: either secret verifies it."""

    previous_secret_expires_at: datetime | None = Field(
        description="When the previous secret stops signing (null with an overlap of 0)."
    )


class WebhookList(_Model):
    webhooks: list[Webhook]


class WebhookDelivery(_Model):
    """One event for one endpoint: how its delivery stands (the answer's body is never kept)."""

    delivery_id: str
    event_id: int = Field(description="The event's id: the `webhook-id` header and the body's `data.id`.")
    elicitation_id: str
    status: DeliveryStatus
    attempts: int
    next_attempt_at: datetime | None
    last_attempt_at: datetime | None
    last_status_code: int | None
    last_error: str | None = Field(description="What went wrong, by name: timeout, connect_failed, address_refused...")
    created_at: datetime
    delivered_at: datetime | None


class WebhookDeliveryList(_Model):
    deliveries: list[WebhookDelivery]


class ErrorDetail(_Model):
    code: str = Field(description="Stable and machine-readable; see the README's error table.")
    message: str = Field(description="A sentence for people.")
    labels: list[str] | None = Field(
        default=None,
        description="`account_choice_needed`: the user's accounts at the provider, by label (pass one as `account`).",
    )


class Error(_Model):
    error: ErrorDetail
