"""The domain's records: frozen dataclasses, one per stored aggregate, and the token set a grant encrypts."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from .accounts import AccountAsk
from .health import GrantHealth, GrantStatus, HealthReason
from .identity import Identity
from .states import DeliveryStatus, ElicitationStatus
from .tenants import EMBEDDED_TENANT, tenant_of_key

OFFLINE_ACCESS = "offline_access"  # the OpenID Connect scope that asks for a refresh token (Core §11)

ScopeKind = Literal["session", "request"]


@dataclass(frozen=True, slots=True)
class ElicitationRecord:
    """One URL-mode elicitation: who asked, on which connection, for which provider and scopes, its status."""

    id: str
    connection_key: str
    identity: Identity
    provider: str
    scopes: tuple[str, ...]
    scope_kind: ScopeKind
    session_id: str | None
    tool_call_id: str | None
    request_id: str | int | None
    agent_name: str
    message: str
    status: ElicitationStatus
    failure_reason: str | None
    created_at: datetime
    expires_at: datetime
    updated_at: datetime
    # The replica whose process holds the ACP connection; None when no process here does.
    replica_id: str | None = None
    # Per-connection values the agent gave for the provider's URLs (a tenant, a shop's subdomain).
    connection_values: Mapping[str, str] = field(default_factory=dict, hash=False)
    # Which account it is for (`service.core.accounts`); None: a first account, none named.
    account: AccountAsk | None = None

    @property
    def tenant(self) -> str:
        """The tenant that asked (an API key's, or the embedded connector's own): the grant it ends in is its."""
        return tenant_of_key(self.connection_key)


@dataclass(frozen=True, slots=True)
class FlowRecord:
    """One authorization-code transaction with a provider. The PKCE verifier is stored encrypted."""

    id: str
    elicitation_id: str
    state_hash: str
    verifier_key_id: str | None
    verifier_ciphertext: bytes | None = field(repr=False)
    nonce: str | None = field(repr=False)
    expected_issuer: str | None
    browser_binding_hash: str
    redirect_uri: str
    created_at: datetime
    expires_at: datetime
    used_at: datetime | None


class Intent(StrEnum):
    """Which button of the consent page the browser pressed; either takes effect only after the identity step."""

    CONTINUE = "continue"
    DECLINE = "decline"


@dataclass(frozen=True, slots=True)
class VerificationRecord:
    """One identity-verification attempt that left the server (OIDC sign-in or confirm hand-off).

    Handles are stored only as hashes; the PKCE verifier is encrypted; `identity` is what the operator confirmed.
    """

    id: str
    elicitation_id: str
    verifier: str
    handle_hash: str
    return_hash: str | None
    browser_binding_hash: str
    nonce: str | None = field(repr=False)
    pkce_key_id: str | None
    pkce_ciphertext: bytes | None = field(repr=False)
    outcome: str | None
    identity: Identity | None
    created_at: datetime
    expires_at: datetime
    confirmed_at: datetime | None
    used_at: datetime | None
    intent: Intent = Intent.CONTINUE  # what to do once the browser's identity is known


@dataclass(frozen=True, slots=True)
class GrantRecord:
    """A user's grant at a provider account: scopes and the encrypted token set."""

    id: str
    identity: Identity
    provider: str
    provider_account_id: str
    scopes: tuple[str, ...]
    token_key_id: str
    token_ciphertext: bytes = field(repr=False)
    token_expires_at: datetime | None
    created_at: datetime
    updated_at: datetime
    refused_scopes: tuple[str, ...] = ()  # asked for when it was made, refused by the provider (a narrowed grant)
    health: GrantHealth = field(default_factory=GrantHealth)
    # The tenant it was made through (an API key's, or the embedded connector's own): only it (and the tenants it
    # shares with, `[tenants] shared_groups`) sees, uses and revokes it.
    tenant: str = EMBEDDED_TENANT
    # The name the user gave this account (else its profile name), unique among the user's accounts at the provider;
    # and the provider's own name for it (a login or e-mail address, from its profile). None: not known.
    account_label: str | None = None
    account_name: str | None = None

    @property
    def account_id(self) -> str:
        """The provider's id of the account (as `GrantInfo.account_id`)."""
        return self.provider_account_id

    def status_at(self, now: datetime) -> tuple[GrantStatus, HealthReason | None]:
        """The grant's status and its reason at `now`: `needs_user` as stored, `expired` once the access token of a
        grant without a refresh token has expired, else `active`."""
        if self.health.needs_user:
            return GrantStatus.NEEDS_USER, self.health.reason
        if self.needs_user_again and self.token_expires_at is not None and self.token_expires_at <= now:
            return GrantStatus.EXPIRED, HealthReason.NO_REFRESH_TOKEN
        return GrantStatus.ACTIVE, None

    @property
    def needs_user_again(self) -> bool:
        """Stored without the refresh token it was asked with (`offline_access` asked, not granted): when its
        access token expires (`token_expires_at`), the user must authorize again."""
        return OFFLINE_ACCESS in self.refused_scopes

    def renewal_note(self) -> str | None:
        """A sentence for operators when the grant will need the user again, else None."""
        if not self.needs_user_again:
            return None
        at = self.token_expires_at.strftime("%Y-%m-%dT%H:%M:%SZ") if self.token_expires_at else "its token's expiry"
        return f"will need the user again at {at} (no refresh token)"


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """An audit event to write with the change it records, by the change's own statement where the store is given it
    with the change (else in the change's transaction). `detail` must be JSON-serialisable; the store bounds and
    redacts it."""

    event: str
    at: datetime
    elicitation_id: str | None = None
    identity: Identity | None = None
    provider: str | None = None
    detail: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One line of the audit trail. `detail` never holds secrets."""

    id: int
    at: datetime
    event: str
    elicitation_id: str | None
    identity: Identity | None
    provider: str | None
    detail: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TokenSet:
    """What a provider's token endpoint issued. Lives decrypted only in memory; its repr shows no token."""

    access_token: str
    token_type: str
    refresh_token: str | None
    expires_at: float | None  # epoch seconds
    scopes: tuple[str, ...] | None  # as granted, when the provider says
    id_token: str | None = None
    issued_at: float | None = None  # epoch seconds; with expires_at it gives the token's lifetime
    # Per-connection values of the grant (a tenant, a shop's subdomain, an instance URL, a company id): the
    # agent's, the callback's and the token response's, kept encrypted with the tokens.
    connection: Mapping[str, str] = field(default_factory=dict, hash=False)
    # The provider account, when the token response names it (not stored: the grant row holds it).
    account_id: str | None = None
    # A credential entry's values as the user typed them (API keys, an account SID and auth token), by field name;
    # `token_type` is then the entry's kind ("api_key", "basic") and `access_token` empty.
    credential: Mapping[str, str] = field(default_factory=dict, hash=False)
    # The private JWK of the key a DPoP-bound token (token_type DPoP, RFC 9449) is bound to: encrypted with the
    # tokens, never shown.
    dpop_key: Mapping[str, str] | None = field(default=None, hash=False, repr=False)

    def __repr__(self) -> str:
        return f"TokenSet(token_type={self.token_type!r}, expires_at={self.expires_at!r}, scopes={self.scopes!r})"

    def to_json(self) -> dict[str, Any]:
        return {
            "access_token": self.access_token,
            "token_type": self.token_type,
            "refresh_token": self.refresh_token,
            "expires_at": self.expires_at,
            "scopes": list(self.scopes) if self.scopes is not None else None,
            "id_token": self.id_token,
            "issued_at": self.issued_at,
            **({"connection": dict(self.connection)} if self.connection else {}),
            **({"credential": dict(self.credential)} if self.credential else {}),
            **({"dpop_key": dict(self.dpop_key)} if self.dpop_key else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TokenSet:
        scopes = data.get("scopes")
        return cls(
            access_token=str(data["access_token"]),
            token_type=str(data.get("token_type") or "Bearer"),
            refresh_token=data.get("refresh_token"),
            expires_at=data.get("expires_at"),
            scopes=tuple(scopes) if scopes is not None else None,
            id_token=data.get("id_token"),
            issued_at=data.get("issued_at"),
            connection={str(k): str(v) for k, v in (data.get("connection") or {}).items()},
            credential={str(k): str(v) for k, v in (data.get("credential") or {}).items()},
            dpop_key={str(k): str(v) for k, v in data["dpop_key"].items()} if data.get("dpop_key") else None,
        )

    @classmethod
    def of_credential(cls, kind: str, values: Mapping[str, str], *, now: float) -> TokenSet:
        """What a credential grant encrypts: the values typed, under the entry's kind; no expiry, no refresh."""
        return cls(
            access_token="",
            token_type=kind,
            refresh_token=None,
            expires_at=None,
            scopes=None,
            issued_at=now,
            credential=dict(values),
        )

    @property
    def is_credential(self) -> bool:
        return bool(self.credential)

    def expires_within(self, seconds: float, *, now: float | None = None) -> bool:
        if self.expires_at is None:
            return False
        return self.expires_at - (time.time() if now is None else now) <= seconds


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    """A key of the `/v1` API: the agent (tenant) it speaks for, and the providers it may use (None: all).

    Only `key_hash` of the key is stored; `id` is its public part, for listing and revoking.
    """

    id: str
    key_hash: str = field(repr=False)
    tenant: str
    agent_name: str
    providers: tuple[str, ...] | None
    created_at: datetime
    revoked_at: datetime | None

    def allows(self, provider: str) -> bool:
        return self.providers is None or provider in self.providers


@dataclass(frozen=True, slots=True)
class ApiElicitationRecord:
    """An elicitation created through the `/v1` API: its tenant, the caller's idempotency key and labels."""

    elicitation_id: str
    tenant: str
    idempotency_key: str | None
    connection_id: str | None
    created_at: datetime
    answered_at: datetime | None


@dataclass(frozen=True, slots=True)
class WebhookEndpointRecord:
    """A tenant's webhook endpoint. The secret is stored encrypted (`secret_key_id`, `secret_ciphertext`)."""

    id: str
    tenant: str
    url: str
    description: str | None
    secret_key_id: str
    secret_ciphertext: bytes
    after_event_id: int  # events up to this one (the log's newest when it was made) are not sent to it
    created_at: datetime
    # The secret a rotation replaced (encrypted like the current one), which signs too until it expires.
    previous_secret_key_id: str | None = None
    previous_secret_ciphertext: bytes | None = None
    previous_secret_expires_at: datetime | None = None

    def previous_secret_live(self, now: datetime) -> bool:
        """Whether the previous secret still signs at `now` (it does until its expiry, exclusive)."""
        return (
            self.previous_secret_key_id is not None
            and self.previous_secret_ciphertext is not None
            and self.previous_secret_expires_at is not None
            and now < self.previous_secret_expires_at
        )

    def __repr__(self) -> str:
        return f"WebhookEndpointRecord(id={self.id!r}, tenant={self.tenant!r}, url={self.url!r})"


@dataclass(frozen=True, slots=True)
class WebhookDeliveryRecord:
    """One event for one endpoint, and how its delivery stands."""

    id: str
    endpoint_id: str
    event_id: int
    elicitation_id: str
    body: str
    status: DeliveryStatus
    attempts: int
    next_attempt_at: datetime | None
    claimed_by: str | None
    lease_until: datetime | None
    last_attempt_at: datetime | None
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """What one attempt gave (the response body is never kept)."""

    delivery_id: str
    attempt: int
    replica_id: str
    at: datetime
    status_code: int | None
    error: str | None
    duration_ms: int


@dataclass(frozen=True, slots=True)
class AttemptResult:
    status_code: int | None = None
    error: str | None = None  # a short, secret-free name of what went wrong (timeout, connect_failed, ...)

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300
