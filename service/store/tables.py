"""The database schema: one MetaData with every table the connector stores, and the column types they share.

Migrations in `migrations/versions` must produce exactly these tables (a test compares them).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.types import TypeDecorator

# Explicit constraint and index names, so migrations and this module agree on every name on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend.

    Values are converted to UTC before they are bound (SQLite stores no offset, so every stored value must
    be UTC for comparisons to hold), naive datetimes are refused, and values read back are aware UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("naive datetime: the store only accepts timezone-aware datetimes")
        return value.astimezone(UTC)

    def process_result_value(self, value: Any | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


ID = String(64)

# Open (not terminal) elicitations: the console's pending list and the overview's count (0017).
OPEN_ELICITATIONS = "status IN ('pending', 'consented', 'verified', 'authorizing')"
# Completed elicitations whose telling is not settled yet (the rows the completion sweeps look for).
COMPLETION_PENDING = (
    "status = 'completed' AND replica_id IS NOT NULL "
    "AND (completion_delivery IS NULL OR completion_delivery = 'delivering')"
)

elicitations = Table(
    "elicitations",
    metadata,
    Column("id", ID, primary_key=True),
    Column("connection_key", String(255), nullable=False),
    Column("identity_issuer", String(512), nullable=False),
    Column("identity_subject", String(512), nullable=False),
    Column("provider", String(64), nullable=False),
    Column("scopes", Text, nullable=False),  # JSON list of strings
    Column("scope_kind", String(16), nullable=False),  # "session" | "request"
    Column("session_id", String(255), nullable=True),
    Column("tool_call_id", String(255), nullable=True),
    Column("request_id", Text, nullable=True),  # JSON: keeps int vs str
    Column("agent_name", String(255), nullable=False),
    Column("message", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("failure_reason", Text, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    # Browsers of another user that tried to finish this elicitation; at identity.max_mismatches it is locked.
    Column("identity_mismatches", Integer, nullable=False, server_default="0"),
    # The replica (`Store.origin` of the process) holding the ACP connection; NULL when no process here does.
    Column("replica_id", String(32), nullable=True),
    # JSON object: the per-connection values the agent gave (a tenant, a subdomain); NULL: none (0013).
    Column("connection_values", Text, nullable=True),
    # JSON object: which account it is for (0019; service.core.accounts.AccountAsk); NULL: a first one, none named.
    Column("account", Text, nullable=True),
    # Telling the client that it completed, decided by conditional updates: NULL (not yet), "delivering" (its
    # replica took it and is sending elicitation/complete), "sent", "undeliverable".
    Column("completion_delivery", String(16), nullable=True),
    Column("step_note", Text, nullable=True),  # SQLite (0020): JSON, a step's rows for triggers (store/step_writes)
    Column("step_blob", LargeBinary, nullable=True),  # SQLite (0021): the ciphertext of a row a step carries
    Index(None, "status", "expires_at"),
    Index(None, "connection_key"),
    # Only the completions still to be told, so that the sweeps looking for them stay cheap.
    Index(
        "ix_elicitations_completion_pending",
        "replica_id",
        postgresql_where=text(COMPLETION_PENDING),
        sqlite_where=text(COMPLETION_PENDING),
    ),
    # The console's lists, newest first, continued by keyset (0017).
    Index("ix_elicitations_created_at_id", "created_at", "id"),
    Index(
        "ix_elicitations_open",
        "created_at",
        "id",
        postgresql_where=text(OPEN_ELICITATIONS),
        sqlite_where=text(OPEN_ELICITATIONS),
    ),
    # Retention: ended elicitations, oldest change first (0018).
    Index(None, "updated_at"),
)

oauth_flows = Table(
    "oauth_flows",
    metadata,
    Column("id", ID, primary_key=True),
    Column("elicitation_id", ID, ForeignKey("elicitations.id", ondelete="CASCADE"), nullable=False),
    Column("state_hash", String(128), nullable=False),
    Column("verifier_key_id", String(64), nullable=True),
    Column("verifier_ciphertext", LargeBinary, nullable=True),
    Column("nonce", String(255), nullable=True),
    Column("expected_issuer", String(512), nullable=True),
    Column("browser_binding_hash", String(128), nullable=False),
    Column("redirect_uri", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("used_at", UTCDateTime, nullable=True),
    UniqueConstraint("state_hash"),
    Index(None, "elicitation_id"),
)

identity_verifications = Table(
    "identity_verifications",
    metadata,
    Column("id", ID, primary_key=True),
    Column("elicitation_id", ID, ForeignKey("elicitations.id", ondelete="CASCADE"), nullable=False),
    Column("verifier", String(32), nullable=False),  # "oidc" | "confirm"
    # Hash of the handle that leaves the server: the OIDC state, or the confirm flow id. Never the handle.
    Column("handle_hash", String(128), nullable=False),
    # confirm: hash of the single-use code the browser brings back after the operator confirmed.
    Column("return_hash", String(128), nullable=True),
    Column("browser_binding_hash", String(128), nullable=False),
    Column("nonce", String(255), nullable=True),
    Column("pkce_key_id", String(64), nullable=True),
    Column("pkce_ciphertext", LargeBinary, nullable=True),  # the PKCE verifier, encrypted by the vault
    Column("outcome", String(16), nullable=True),  # confirm: "confirmed" | "mismatch"
    Column("identity_issuer", String(512), nullable=True),
    Column("identity_subject", String(512), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("confirmed_at", UTCDateTime, nullable=True),
    Column("used_at", UTCDateTime, nullable=True),
    # The consent page's button: "continue" or "decline" (NULL, from before 0004: continue).
    Column("intent", String(16), nullable=True),
    UniqueConstraint("handle_hash"),
    UniqueConstraint("return_hash"),
    Index(None, "elicitation_id"),
    Index(None, "expires_at"),  # retention: expired verifications, oldest first (0018)
)

grants = Table(
    "grants",
    metadata,
    Column("id", ID, primary_key=True),
    Column("identity_issuer", String(512), nullable=False),
    Column("identity_subject", String(512), nullable=False),
    Column("provider", String(64), nullable=False),
    Column("provider_account_id", String(255), nullable=False),
    Column("scopes", Text, nullable=False),  # JSON list of strings
    Column("refused_scopes", Text, nullable=True),  # JSON list: asked for, refused by the provider; NULL: none
    Column("token_key_id", String(64), nullable=False),
    Column("token_ciphertext", LargeBinary, nullable=False),
    Column("token_expires_at", UTCDateTime, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    # Health (service.core.health; NULL: active, as every grant stored before 0012 is). `needs_user` holds only
    # while the tokens are the ones it was marked on: `health_changed_at` >= `updated_at`.
    Column("health_status", String(16), nullable=True),
    Column("health_reason", String(32), nullable=True),
    Column("health_changed_at", UTCDateTime, nullable=True),
    Column("last_refresh_at", UTCDateTime, nullable=True),
    Column("last_failure_at", UTCDateTime, nullable=True),
    Column("next_refresh_at", UTCDateTime, nullable=True),  # no refresh before (backoff after transient failures)
    Column("refresh_failures", Integer, nullable=True),  # transient failures in a row
    # The tenant it was made through (0015; service.core.tenants): only it, and tenants sharing with it, see it.
    Column("tenant", String(64), nullable=False),
    # Several accounts per provider (0019; service.core.accounts): the name the user gave the account (else its
    # profile name), unique among the user's accounts there; and the provider's own name for it (login, e-mail).
    Column("account_label", String(128), nullable=True),
    Column("account_name", String(128), nullable=True),
    # Also serves find(identity, provider[, tenants]): its leading columns are issuer, subject, provider, tenant.
    UniqueConstraint(
        "identity_issuer",
        "identity_subject",
        "provider",
        "tenant",
        "provider_account_id",
        name="uq_grants_tenant_account",
    ),
    # The console: keyset pages newest first, by user and by provider; the overview's counts; keys (0017).
    Index("ix_grants_updated_at_id", "updated_at", "id"),
    Index("ix_grants_identity_subject_updated_at_id", "identity_subject", "updated_at", "id"),
    Index("ix_grants_provider_updated_at_id", "provider", "updated_at", "id"),
    Index("ix_grants_token_key_id", "token_key_id"),
    Index(
        "ix_grants_needs_user",
        "provider",
        "updated_at",
        "id",
        postgresql_where=text("health_status IS NOT NULL"),
        sqlite_where=text("health_status IS NOT NULL"),
    ),
    Index(
        "ix_grants_failing",
        "updated_at",
        "id",
        postgresql_where=text("refresh_failures IS NOT NULL"),
        sqlite_where=text("refresh_failures IS NOT NULL"),
    ),
    # A tenant's grants, newest first (the listing with `tenants`; 0015).
    Index("ix_grants_tenant_updated", "tenant", "updated_at", "id"),
)

audit_events = Table(
    "audit_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime, nullable=False),
    Column("event", String(64), nullable=False),
    # No foreign key: the audit trail outlives elicitations and may name ids that never existed.
    Column("elicitation_id", ID, nullable=True),
    Column("identity_issuer", String(512), nullable=True),
    Column("identity_subject", String(512), nullable=True),
    Column("provider", String(64), nullable=True),
    Column("detail", Text, nullable=False),  # JSON object
    Index(None, "elicitation_id"),
    Index(None, "event"),
    # The console: keyset pages newest first, by user, provider or event (0017).
    Index("ix_audit_events_at_id", "at", "id"),
    Index("ix_audit_events_identity_subject_at_id", "identity_subject", "at", "id"),
    Index("ix_audit_events_provider_at_id", "provider", "at", "id"),
    Index("ix_audit_events_event_at_id", "event", "at", "id"),
)

# One row: the oldest code revision that still runs on this schema, written by every migration run
# (`service.store.schema`). A replica whose code is older than the database reads it to know whether it may serve.
schema_compatibility = Table(
    "schema_compatibility",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("oldest_code_revision", String(32), nullable=False),
)

# The durable, ordered log of terminal changes (the outbox): written in the transaction of each change, read by
# "id > last seen" (the shared poll here; LISTEN/NOTIFY catch-up and SSE resumption build on the same query).
# Ids only, never a secret. Ids grow in commit order: SQLite has one writer at a time, and on PostgreSQL each
# insert takes a transaction-level advisory lock first (see store/outbox.py). AUTOINCREMENT: SQLite never
# hands out an id again after the newest rows were purged.
elicitation_events = Table(
    "elicitation_events",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("elicitation_id", ID, nullable=False),  # no foreign key: events outlive purged elicitations
    Column("connection_key", String(255), nullable=False),
    Column("status", String(16), nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("origin", String(32), nullable=False),  # the writing process (`Store.origin`): it skips its own events
    # NULL: an elicitation's terminal change. Else a grant event (`grant.needs_user`, ...): `elicitation_id` holds
    # the grant's id and `detail` its JSON (ids and a reason code, never a token); see migration 0012.
    Column("kind", String(32), nullable=True),
    Column("detail", Text, nullable=True),
    Index(None, "at"),
    sqlite_autoincrement=True,
)

# Keys of the `/v1` API. Only a hash of each key is stored; `id` is the public part that names it.
api_keys = Table(
    "api_keys",
    metadata,
    Column("id", ID, primary_key=True),
    Column("key_hash", String(128), nullable=False),
    Column("tenant", String(64), nullable=False),  # the agent the key belongs to; its elicitations are its own
    Column("agent_name", String(255), nullable=False),  # shown on the consent page
    Column("providers", Text, nullable=True),  # JSON list of catalog names; NULL: every provider
    Column("created_at", UTCDateTime, nullable=False),
    Column("revoked_at", UTCDateTime, nullable=True),
    UniqueConstraint("key_hash"),
    Index(None, "tenant"),
)

# Elicitations created through the `/v1` API: whose they are, and the caller's idempotency key.
api_elicitations = Table(
    "api_elicitations",
    metadata,
    Column("elicitation_id", ID, ForeignKey("elicitations.id", ondelete="CASCADE"), primary_key=True),
    Column("tenant", String(64), nullable=False),
    Column("idempotency_key", String(255), nullable=True),
    Column("connection_id", String(255), nullable=True),  # the agent's own label for the ACP connection
    Column("created_at", UTCDateTime, nullable=False),
    Column("answered_at", UTCDateTime, nullable=True),  # when the agent reported the client's answer (once)
    UniqueConstraint("tenant", "idempotency_key"),
)

# The live replicas: each process sharing the database (by its `Store.origin`) writes its row at start and a
# heartbeat while it runs. One silent for `replicas.dead_after_seconds` is gone, with the connections it held.
replicas = Table(
    "replicas",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("started_at", UTCDateTime, nullable=False),
    Column("heartbeat_at", UTCDateTime, nullable=False),
)

# Webhook endpoints of `/v1` tenants. The signing secret is stored only encrypted by the vault (associated data:
# the endpoint's id and tenant). Events logged up to `after_event_id` (the newest when it was made) are not sent.
webhook_endpoints = Table(
    "webhook_endpoints",
    metadata,
    Column("id", ID, primary_key=True),
    Column("tenant", String(64), nullable=False),
    Column("url", Text, nullable=False),
    Column("description", String(255), nullable=True),
    Column("secret_key_id", String(64), nullable=False),
    Column("secret_ciphertext", LargeBinary, nullable=False),
    Column("after_event_id", BigInteger, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    # After a secret rotation: the secret before it (same vault, same associated data), signing alongside the
    # current one until `previous_secret_expires_at`. All three are set together or are all NULL.
    Column("previous_secret_key_id", String(64), nullable=True),
    Column("previous_secret_ciphertext", LargeBinary, nullable=True),
    Column("previous_secret_expires_at", UTCDateTime, nullable=True),
    Index(None, "tenant"),
)

# One event for one endpoint. An attempt is taken by one replica by a conditional update (status `delivering`,
# `claimed_by`, `lease_until`, `attempts` + 1); the body is the event as the stream sends it, never a secret.
webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("id", ID, primary_key=True),
    Column("endpoint_id", ID, ForeignKey("webhook_endpoints.id", ondelete="CASCADE"), nullable=False),
    Column("event_id", BigInteger, nullable=False),
    Column("elicitation_id", ID, nullable=False),
    Column("body", Text, nullable=False),
    Column("status", String(16), nullable=False),  # pending | delivering | delivered | failed
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", UTCDateTime, nullable=True),
    Column("claimed_by", String(32), nullable=True),
    Column("lease_until", UTCDateTime, nullable=True),
    Column("last_attempt_at", UTCDateTime, nullable=True),
    Column("last_status_code", Integer, nullable=True),
    Column("last_error", String(128), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("delivered_at", UTCDateTime, nullable=True),
    UniqueConstraint("endpoint_id", "event_id"),
    Index(None, "status", "next_attempt_at"),
    Index(None, "last_attempt_at"),  # retention: ended deliveries, oldest last attempt first (0018)
    # The console: deliveries newest first, of all endpoints or of one (0017).
    Index("ix_webhook_deliveries_created_at_id", "created_at", "id"),
    Index("ix_webhook_deliveries_endpoint_id_created_at_id", "endpoint_id", "created_at", "id"),
)

# Every attempt, one row each: (delivery, attempt number) is unique, so no attempt is made twice.
webhook_attempts = Table(
    "webhook_attempts",
    metadata,
    Column("delivery_id", ID, ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), primary_key=True),
    Column("attempt", Integer, primary_key=True, autoincrement=False),
    Column("replica_id", String(32), nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("status_code", Integer, nullable=True),
    Column("error", String(128), nullable=True),
    Column("duration_ms", Integer, nullable=False),
)

# One row: the last event-log id turned into webhook deliveries (moved by a conditional update).
webhook_cursor = Table(
    "webhook_cursor",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("last_event_id", BigInteger, nullable=False),
)
