"""What the domain needs from the parts around it, as protocols: the store, the vault, providers, events, verifiers.

The core imports none of those parts; `service.app` hands it the real ones (`service.store.Store`,
`service.vault.Vault`, `service.oauth.ProviderGateway`, `service.events.LocalBus`, a verifier from
`service.identity`), and mypy checks that they fit. A transaction handle (`Tx`) is opaque to the core: it only
passes it back to repository methods so that several writes commit together.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, TypeVar

from .accounts import AccountAsk
from .credentials import CredentialForm, CredentialVerdict
from .events import ElicitationEvent, Event, GrantEvent, LoggedEvent
from .identity import Identity
from .records import (
    ApiElicitationRecord,
    ApiKeyRecord,
    AttemptRecord,
    AttemptResult,
    AuditEntry,
    AuditRecord,
    ElicitationRecord,
    FlowRecord,
    GrantRecord,
    TokenSet,
    VerificationRecord,
    WebhookDeliveryRecord,
    WebhookEndpointRecord,
)
from .retention import RetentionRepo
from .states import CompletionDelivery, DeliveryStatus, ElicitationStatus

Tx = Any  # an open transaction of the store, passed through unchanged


class ElicitationRepo(Protocol):
    # `audit`: the change's audit row, written with it (in its statement where the database can).
    async def insert(self, rec: ElicitationRecord, conn: Tx = None, *, audit: AuditEntry | None = None) -> None: ...
    async def get(self, id: str, conn: Tx = None) -> ElicitationRecord | None: ...
    async def get_audited(
        self, id: str, audit: AuditEntry, *, now: datetime
    ) -> tuple[ElicitationRecord, bool] | None: ...
    async def transition(
        self,
        id: str,
        target: ElicitationStatus,
        *,
        reason: str | None = None,
        now: datetime,
        from_: Collection[ElicitationStatus] | None = None,
        conn: Tx = None,
        audit: AuditEntry | None = None,
        take_telling: bool = False,
        flow: FlowRecord | None = None,
        last: bool = False,
    ) -> ElicitationRecord | None: ...
    async def end(
        self,
        id: str,
        target: ElicitationStatus,
        ending: ElicitationEvent,
        *,
        reason: str | None = None,
        now: datetime,
        conn: Tx,
        audit: AuditEntry,
        take_telling: bool = False,
        last: bool = False,
    ) -> tuple[ElicitationRecord, ElicitationEvent] | None: ...
    async def end_with_first_grant(
        self,
        id: str,
        target: ElicitationStatus,
        ending: ElicitationEvent,
        grant: GrantRecord,
        *,
        now: datetime,
        conn: Tx,
        audit: AuditEntry,
        take_telling: bool = False,
        last: bool = False,
    ) -> tuple[bool, tuple[ElicitationRecord, ElicitationEvent] | None]: ...
    async def add_identity_mismatch(self, id: str, *, now: datetime, conn: Tx = None) -> int: ...
    async def claim_completion(self, id: str, replica_id: str, conn: Tx = None) -> datetime | None: ...
    async def release_telling(self, id: str, conn: Tx = None) -> bool: ...
    async def settle_completion(
        self, id: str, outcome: CompletionDelivery, conn: Tx = None, *, audit: AuditEntry | None = None
    ) -> bool: ...
    async def expire_due(
        self, now: datetime, *, limit: int = ..., reason: str | None = None, conn: Tx = None
    ) -> list[ElicitationRecord]: ...


class FlowRepo(Protocol):
    async def insert(self, rec: FlowRecord, conn: Tx = None) -> None: ...
    async def get_by_state_hash(self, state_hash: str, conn: Tx = None) -> FlowRecord | None: ...
    async def get_with_elicitation(
        self, state_hash: str, conn: Tx = None
    ) -> tuple[FlowRecord, ElicitationRecord, bool] | None:
        """The flow, its elicitation, and whether the elicitation's user held any grant at its provider then."""
        ...

    async def claim(self, state_hash: str, now: datetime, conn: Tx = None) -> FlowRecord | None: ...
    async def claim_with_elicitation(
        self,
        state_hash: str,
        now: datetime,
        *,
        provider: str,
        binding_hash: str,
        statuses: Collection[str],
        conn: Tx = None,
    ) -> tuple[FlowRecord, ElicitationRecord, bool] | None: ...

    async def invalidate_open(self, elicitation_id: str, now: datetime, conn: Tx = None) -> int: ...


class GrantRepo(Protocol):
    async def upsert(self, rec: GrantRecord, conn: Tx = None) -> GrantRecord: ...
    async def insert_new(self, rec: GrantRecord, conn: Tx = None) -> GrantRecord | None: ...
    async def find(
        self, identity: Identity, provider: str, conn: Tx = None, *, tenants: Collection[str] | None = None
    ) -> list[GrantRecord]: ...
    async def get(self, id: str, conn: Tx = None) -> GrantRecord | None: ...
    async def delete(self, id: str, conn: Tx = None) -> bool: ...


class AuditRepo(Protocol):
    async def record(
        self,
        event: str,
        *,
        elicitation_id: str | None = None,
        identity: Identity | None = None,
        provider: str | None = None,
        detail: Mapping[str, Any] | None = None,
        now: datetime | None = None,
        conn: Tx = None,
    ) -> None: ...

    async def record_many(
        self,
        event: str,
        records: Sequence[ElicitationRecord],
        *,
        detail: Mapping[str, Any] | None = None,
        now: datetime,
        conn: Tx,
    ) -> None: ...

    async def list(
        self, *, elicitation_id: str | None = None, event: str | None = None, conn: Tx = None
    ) -> list[AuditRecord]: ...


Logged = TypeVar("Logged", ElicitationEvent, GrantEvent)


class OutboxRepo(Protocol):
    """The durable, ordered event log of terminal changes (see `service.store.outbox`)."""

    async def append(self, events: Sequence[Logged], *, at: datetime, conn: Tx) -> list[Logged]: ...
    async def after(self, last_id: int, *, limit: int = ..., conn: Tx = None) -> list[LoggedEvent]: ...
    async def last_id(self, conn: Tx = None) -> int: ...


class VerificationRepo(Protocol):
    async def insert(self, rec: VerificationRecord, conn: Tx = None) -> None: ...
    async def get_by_handle(self, handle_hash: str, conn: Tx = None) -> VerificationRecord | None: ...


class Store(Protocol):
    @property
    def origin(self) -> str:
        """This process's name in the event log (events it wrote are published here at their commit)."""
        ...

    @property
    def elicitations(self) -> ElicitationRepo: ...
    @property
    def flows(self) -> FlowRepo: ...
    @property
    def grants(self) -> GrantRepo: ...
    @property
    def audit(self) -> AuditRepo: ...
    @property
    def outbox(self) -> OutboxRepo: ...
    @property
    def retention(self) -> RetentionRepo: ...
    def transaction(self) -> AbstractAsyncContextManager[Tx]: ...


class ApiKeyRepo(Protocol):
    async def insert(self, rec: ApiKeyRecord, conn: Tx = None) -> None: ...
    async def by_hash(self, key_hash: str, conn: Tx = None) -> ApiKeyRecord | None: ...
    async def list(self, conn: Tx = None) -> list[ApiKeyRecord]: ...
    async def revoke(self, id: str, now: datetime, conn: Tx = None) -> bool: ...


class ApiElicitationRepo(Protocol):
    async def claim(self, rec: ApiElicitationRecord, conn: Tx = None) -> bool: ...
    async def get(self, elicitation_id: str, conn: Tx = None) -> ApiElicitationRecord | None: ...
    async def by_idempotency_key(
        self, tenant: str, idempotency_key: str, conn: Tx = None
    ) -> ApiElicitationRecord | None: ...
    async def mark_answered(self, elicitation_id: str, now: datetime, conn: Tx = None) -> bool: ...


class ApiStore(Store, Protocol):
    """The store as the `/v1` API needs it: the lifecycle's repositories plus API keys and API elicitations."""

    @property
    def api_keys(self) -> ApiKeyRepo: ...
    @property
    def api_elicitations(self) -> ApiElicitationRepo: ...


class Vault(Protocol):
    def encrypt(self, plaintext: bytes, *, aad: bytes) -> tuple[str, bytes]: ...
    def decrypt(self, key_id: str, blob: bytes, *, aad: bytes) -> bytes: ...
    def encrypt_json(self, obj: Any, *, aad: bytes) -> tuple[str, bytes]: ...
    def decrypt_json(self, key_id: str, blob: bytes, *, aad: bytes) -> Any: ...


class EventSink(Protocol):
    def publish(self, event: Event) -> None: ...


class AuditGate(Protocol):
    """Decides whether an audit event caused by a request that carried no credential at all is written."""

    async def admit(self, event: str) -> bool: ...


class FlowMetrics(Protocol):
    """What the lifecycle reports to the connector's metrics (after each commit)."""

    def flow_started(self, provider: str) -> None: ...
    def flow_ended(self, provider: str, status: ElicitationStatus) -> None: ...


class WebhookMetrics(Protocol):
    """What webhook delivery reports to the connector's metrics: each attempt made, how long it took, and the status
    its delivery then took (`None` when another replica took the delivery meanwhile); and the backlog, as last read:
    the deliveries waiting in the whole database, and the age of the oldest of them in seconds (0 when none)."""

    def webhook_attempt(self, status: DeliveryStatus | None, seconds: float) -> None: ...
    def webhook_backlog(self, waiting: int, oldest_seconds: float) -> None: ...


class EventSource(Protocol):
    """Where waiters learn that an elicitation ended (one future per waiter, resolved with the terminal event, or
    with None by whoever else may wake the waiter, e.g. a closed connection), and listeners hear every event."""

    def add_listener(self, listener: Callable[[Event], None]) -> None: ...

    def waiter(self, elicitation_id: str) -> AbstractContextManager[asyncio.Future[ElicitationEvent | None]]: ...


class Provider(Protocol):
    """A provider with every endpoint known (what `ProviderGateway.resolve` returns)."""

    @property
    def name(self) -> str: ...
    @property
    def display_name(self) -> str: ...
    @property
    def issuer(self) -> str | None: ...
    @property
    def authorization_endpoint(self) -> str: ...
    @property
    def default_scopes(self) -> tuple[str, ...]: ...
    @property
    def sign_in_host(self) -> str:
        """The host the user is sent to (the consent page highlights it)."""
        ...

    def describe_scope(self, scope: str) -> str | None:
        """What `scope` gives, in words (the consent page shows it beside the scope), or None."""
        ...


@dataclass(frozen=True, slots=True)
class AuthorizationRequest:
    """Where to send the browser, and the per-transaction values to remember (the verifier never leaves us)."""

    url: str = field(repr=False)
    state: str = field(repr=False)
    code_verifier: str | None = field(repr=False)
    nonce: str | None = field(repr=False)
    expected_issuer: str | None


@dataclass(frozen=True, slots=True)
class Authorized:
    """What the provider granted: the tokens, the provider account they belong to, and the name the user knows
    that account by (a login or an address, from the profile or the ID token; None when neither gives one)."""

    tokens: TokenSet
    account_id: str
    account_label: str | None = None


class ProviderGateway(Protocol):
    """The protocol to providers: resolution, the authorization request, and redeeming the code."""

    def display_name(self, name: str) -> str: ...

    async def resolve(self, name: str) -> Provider: ...

    def connection_values(self, name: str, given: Mapping[str, str] | None) -> dict[str, str]:
        """The per-connection values an agent gave for provider `name`, checked, defaults filled (FlowRefused
        `missing_connection_value` / `invalid_connection_value` naming the value)."""
        ...

    def bind(self, provider: Provider, values: Mapping[str, str]) -> Provider:
        """`provider` with its endpoints filled from a connection's per-connection values."""
        ...

    async def authorization_request(
        self, provider: Provider, *, redirect_uri: str, scopes: Sequence[str], account: AccountAsk | None = None
    ) -> AuthorizationRequest:
        """A new authorization request (pushed to the provider first where PAR is used: ConnectorError if that
        fails); `account`: which of the user's accounts it is for (a new one: the provider's account chooser)."""
        ...

    def issuer_acceptable(self, provider: Provider, expected: str | None, received: str | None) -> bool:
        """RFC 9207: whether the `iss` of an authorization response (None: absent) is acceptable."""
        ...

    async def redeem(
        self,
        provider: Provider,
        *,
        redirect_uri: str,
        code: str,
        code_verifier: str | None,
        expected_issuer: str | None,
        nonce: str | None,
        now: datetime,
        issued_after: datetime | None = None,
        callback: Mapping[str, str] | None = None,
    ) -> Authorized:
        """Redeem the code; an OpenID provider's ID token must carry `nonce` and be issued after `issued_after`.
        `callback`: the callback's parameters (some providers send a per-connection value there)."""
        ...

    # -- credential entries (API keys, HTTP Basic): typed on the connector's page -------------------------------
    def credential_form(self, name: str) -> CredentialForm | None:
        """What the credential page asks for provider `name`; None for an OAuth provider."""
        ...

    def entry_kind(self, name: str) -> str:
        """The catalog entry's kind: "oauth", "api_key" or "basic"."""
        ...

    def credential_problems(self, name: str, values: Mapping[str, str]) -> dict[str, str]:
        """Each field's format problem (field name -> a sentence that never repeats the value); empty when none."""
        ...

    async def check_credential(self, provider: Provider, values: Mapping[str, str]) -> CredentialVerdict:
        """Run the entry's check request with `values` injected: the account it names, or the refusal in words.
        ProviderError (`provider_timeout`, `provider_unavailable`) when the provider gave no usable answer."""
        ...

    def credential_hint(self, name: str, values: Mapping[str, str]) -> str:
        """What may be shown of stored values (the last four characters of each)."""
        ...


class WebhookRepo(Protocol):
    """Webhook endpoints and deliveries (see `service.core.webhooks`)."""

    async def insert_endpoint(self, rec: WebhookEndpointRecord, conn: Tx = None) -> None: ...
    async def endpoints(self, tenant: str | None = None, conn: Tx = None) -> list[WebhookEndpointRecord]: ...
    async def endpoint(self, id: str, conn: Tx = None) -> WebhookEndpointRecord | None: ...
    async def delete_endpoint(self, id: str, conn: Tx = None) -> bool: ...
    async def replace_secret(
        self,
        id: str,
        *,
        old_key_id: str,
        old_ciphertext: bytes,
        new_key_id: str,
        new_ciphertext: bytes,
        previous_expires_at: datetime | None,
        conn: Tx = None,
    ) -> bool: ...
    async def cursor(self, conn: Tx = None) -> int: ...
    async def enqueue(
        self, deliveries: Sequence[WebhookDeliveryRecord], *, from_cursor: int, to_cursor: int, conn: Tx = None
    ) -> bool: ...
    async def claim_due(
        self, *, now: datetime, replica_id: str, lease_until: datetime, limit: int
    ) -> list[WebhookDeliveryRecord]: ...
    async def settle(
        self,
        delivery: WebhookDeliveryRecord,
        *,
        replica_id: str,
        status: DeliveryStatus,
        next_attempt_at: datetime | None,
        attempt: AttemptRecord,
    ) -> bool: ...
    async def deliveries(self, endpoint_id: str, *, limit: int, conn: Tx = None) -> list[WebhookDeliveryRecord]: ...
    async def attempts(self, delivery_id: str, conn: Tx = None) -> list[AttemptRecord]: ...
    async def backlog(self, conn: Tx = None) -> tuple[int, datetime | None]: ...


class WebhookSender(Protocol):
    """Sends one signed POST and says how it went; never follows a redirect, never keeps the response body."""

    async def send(self, url: str, headers: Mapping[str, str], body: bytes) -> AttemptResult: ...
