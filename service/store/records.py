"""The records the store reads and writes: frozen dataclasses, one per stored aggregate."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from service.identity import Identity
from service.states import ElicitationStatus

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
