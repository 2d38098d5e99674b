"""The sections of the settings (`[server]`, `[database]`, ...): their keys, defaults, checks and plain-value views.

Each field's docstring is its description (docs/reference.md is generated from them). A section that a part of the
connector needs as plain values gives them itself (`retention.policy()`, `webhooks.policy()`), so the composition
root and the CLI build them the same way.
"""

from __future__ import annotations

import ipaddress
import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode

from service.core.health import ProactivePolicy, RefreshBackoff
from service.core.retention import RetentionPolicy
from service.core.tenants import TenantSharing
from service.core.webhooks import WebhookPolicy

from .values import optional_secret, optional_str, split_list

__all__ = [
    "DATABASE_SCHEMES",
    "RATE_LIMIT_STORAGES",
    "AdminSettings",
    "ApiSettings",
    "DatabaseSettings",
    "ElicitationSettings",
    "EventsSettings",
    "IdentitySettings",
    "MetricsSettings",
    "ProvidersSettings",
    "RateLimitSettings",
    "ReplicaSettings",
    "RetentionSettings",
    "ServerSettings",
    "TenantSettings",
    "VaultSettings",
    "WebhookSettings",
]


class _Section(BaseModel):
    # Each field's docstring is its description (docs/reference.md is generated from them: util/docstrings.py).
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Section):
    host: str = Field(default="127.0.0.1", min_length=1)
    """Address the HTTP server listens on. 127.0.0.1 keeps it private to this machine; 0.0.0.0 (behind a
    TLS-terminating proxy that serves public_base_url) accepts connections from elsewhere."""
    port: int = Field(default=8700, ge=1, le=65535)
    """Port the HTTP server listens on."""
    shutdown_grace_seconds: int = Field(default=5, ge=0, le=300)
    """How long the server, told to stop (SIGTERM, Ctrl-C), lets open requests finish before it cancels them.
    Event streams end at once (a last comment, then the end); keep it below the orchestrator's own limit
    (`docker stop` waits 10 s before SIGKILL)."""
    trusted_proxies: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Reverse proxies (CIDR networks) whose forwarded headers are believed: X-Forwarded-For for the client address
    (rate limits) and, with the trusted_header verifier, the identity headers. Empty: none are believed. In the
    environment: comma-separated."""

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _split_networks(cls, value: Any) -> Any:
        return split_list(value)

    @field_validator("trusted_proxies")
    @classmethod
    def _check_networks(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"'{entry}' is not an IP network (e.g. 10.0.0.0/8 or 127.0.0.1/32)") from None
        return value


DATABASE_SCHEMES = ("sqlite+aiosqlite", "postgresql+asyncpg")


class DatabaseSettings(_Section):
    url: str = Field(default="sqlite+aiosqlite:///./var/connector.db", min_length=1)
    """SQLAlchemy async URL: sqlite+aiosqlite:///./var/connector.db (one process; the folder is created) or
    postgresql+asyncpg://user@host:5432/connector (replicas sharing one database; put the password in the
    environment, not the file)."""
    pool_size: int = Field(default=10, gt=0, le=1000)
    """Connections kept open. PostgreSQL: the pool reads and writes share. SQLite: reading connections (every write
    goes through one connection per process)."""
    max_overflow: int = Field(default=10, ge=0, le=1000)
    """Extra connections opened under load, closed again when returned."""
    pool_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    """How long a request waits for a free connection (SQLite: for its turn to write) before it fails."""

    @field_validator("url")
    @classmethod
    def _check_driver(cls, value: str) -> str:
        scheme, sep, _ = value.partition("://")
        scheme = scheme.strip().lower()
        if not sep or not re.fullmatch(r"[a-z0-9+.-]+", scheme):
            raise ValueError(f"not a database URL: use {' or '.join(s + '://...' for s in DATABASE_SCHEMES)}")
        if scheme not in DATABASE_SCHEMES:
            # The scheme only: the rest of a URL may hold a password.
            raise ValueError(f"unsupported database '{scheme}': use {' or '.join(s + '://' for s in DATABASE_SCHEMES)}")
        return value


class ElicitationSettings(_Section):
    ttl_seconds: int = Field(default=600, gt=0)
    """How long a user has, after the agent asks, to open the link and finish authorizing; an elicitation nobody
    finishes is expired then."""
    sweep_interval_seconds: float = Field(default=5.0, gt=0, le=3600)
    """How often the sweeper looks for elicitations whose time is up."""


class EventsSettings(_Section):
    poll_interval_seconds: float = Field(default=1.0, gt=0, le=60)
    """While anything in this process waits for an elicitation, how often it reads the changes other processes wrote
    to the event log."""


class ReplicaSettings(_Section):
    """`[replicas]`: how the processes sharing one database know which of them are alive.

    Each writes a heartbeat every `heartbeat_seconds`; one silent for `dead_after_seconds` is gone, and the
    completions its connections were waiting for are recorded undeliverable by the others.
    """

    heartbeat_seconds: float = Field(default=5.0, gt=0, le=3600)
    """How often each process writes its heartbeat."""
    dead_after_seconds: float = Field(default=30.0, gt=0, le=86400)
    """A process silent this long is gone: its connections' pending completions are recorded undeliverable (at
    least 3 heartbeats)."""

    @model_validator(mode="after")
    def _dead_after_several_beats(self) -> ReplicaSettings:
        if self.dead_after_seconds < 3 * self.heartbeat_seconds:
            raise ValueError("dead_after_seconds must be at least 3 heartbeats (3 x heartbeat_seconds)")
        return self


class RetentionSettings(_Section):
    """Days to keep rows that are no longer needed (0: keep forever). Grants are never deleted by retention."""

    elicitation_days: int = Field(default=30, ge=0)
    """Days to keep ended elicitations, with their OAuth flows and verifications (0: forever)."""
    verification_days: int = Field(default=7, ge=0)
    """Days to keep identity-verification rows after they expired (0: forever)."""
    audit_days: int = Field(default=365, ge=0)
    """Days to keep audit events (0: forever)."""
    event_days: int = Field(default=7, ge=0)
    """Days to keep the event log: how far back an event stream (or a replica that was down) can catch up (0:
    forever)."""
    webhook_delivery_days: int = Field(default=7, ge=0)
    """Days to keep webhook deliveries, with their attempts, after they ended (delivered or failed; a pending one is
    never deleted) (0: forever)."""
    batch_size: int = Field(default=500, gt=0, le=100_000)
    """The most rows deleted per transaction when retention is applied (each batch is sized by the last one's time,
    aiming at 30 ms, and followed by a rest as long)."""
    interval_seconds: float = Field(default=300.0, gt=0)
    """How often the running service applies retention (`acp-connector purge` applies it at once)."""

    def policy(self) -> RetentionPolicy:
        """What the sweeper and `acp-connector purge` delete, as plain values."""
        return RetentionPolicy(
            elicitation_days=self.elicitation_days,
            verification_days=self.verification_days,
            audit_days=self.audit_days,
            event_days=self.event_days,
            webhook_delivery_days=self.webhook_delivery_days,
            batch_size=self.batch_size,
        )


class IdentitySettings(BaseModel):
    """`[identity]`: which verifier learns who is in the browser. Each verifier's own settings are in
    `[identity.<name>]` (e.g. `[identity.oidc]`), validated by that verifier (`service.identity`)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    verifier: str = Field(default="local", min_length=1)
    """How the service proves that the person in the browser is the user the agent bound the link to: local
    (development, loopback only), oidc, trusted_header, confirm, or an installed plugin. Each reads its own
    [identity.<name>] table."""
    max_mismatches: int = Field(default=3, gt=0, le=100)
    """How many times another account may try to finish one link before it fails as locked."""

    def section(self, name: str) -> dict[str, Any]:
        """The `[identity.<name>]` table as written (TOML and environment merged); empty when absent."""
        value = (self.model_extra or {}).get(name)
        return dict(value) if isinstance(value, dict) else {}


class VaultSettings(_Section):
    # NoDecode: the environment may give `CONNECTOR_VAULT__KEYS="k1:AAA,k0:BBB"` as well as a JSON list.
    keys: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    """Token-encryption keys, KID:BASE64URL each (`acp-connector keys generate`); environment only, comma-separated
    or a JSON list. The first (or primary_key_id) encrypts, the others still decrypt."""
    key_file: Path | None = None
    """A file of keys, one KID:BASE64URL per line, readable only by its owner (e.g. a mounted secret). On a loopback
    deployment without any key, serve creates var/vault.keys."""
    primary_key_id: str | None = None
    """The key id that encrypts new data; unset: the first key given."""

    @field_validator("keys", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if isinstance(value, str):
            text = value.strip()
            if not text:
                return []
            if text.startswith("["):
                try:
                    return json.loads(text)
                except ValueError:
                    raise ValueError("not a JSON list of KID:KEY strings") from None
            return [part for part in text.replace("\n", ",").split(",") if part.strip()]
        return value

    @field_validator("keys")
    @classmethod
    def _check_key_shape(cls, value: list[SecretStr]) -> list[SecretStr]:
        for index, key in enumerate(value):
            kid, sep, material = key.get_secret_value().strip().partition(":")
            if not sep or not kid.strip() or not material.strip():
                # Never echo the value: it is key material.
                raise ValueError(f"entry {index} is not of the form KID:BASE64KEY")
        return value

    @field_validator("key_file", "primary_key_id", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return optional_str(value)


class ProvidersSettings(BaseModel):
    """`[providers]`: where the catalog is, and how the connector talks to providers.

    Each provider's own keys live in the catalog file; `CONNECTOR_PROVIDERS__<NAME>__<KEY>` sets or overrides one
    of them (read by `service.providers.load_catalog`), so this section tolerates those tables from the environment.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    catalog: Path = Path("providers.toml")
    """The provider catalog file (endpoints, scopes and options per OAuth provider); relative to the config file."""
    discovery_ttl_seconds: int = Field(default=3600, ge=0)
    """How long a provider's discovery document (and its JWKS) is cached; a failed read is retried at next use."""
    http_timeout_seconds: float = Field(default=15.0, gt=0)
    """Timeout of each request to a provider (one pooled HTTP client per provider: token, revocation, userinfo,
    discovery, keys and its API)."""
    http_max_connections: int = Field(default=100, gt=0)
    """Connections per provider in the pooled HTTP client."""
    http_max_keepalive_connections: int = Field(default=20, ge=0)
    """Idle connections kept per provider."""
    http_keepalive_expiry_seconds: float = Field(default=30.0, ge=0)
    """How long an idle provider connection is kept."""


RATE_LIMIT_STORAGES = ("memory", "redis", "rediss", "redis+sentinel", "redis+cluster")


class RateLimitSettings(_Section):
    """Rate limits on the browser-facing routes: `<route>_per_address` and `<route>_per_elicitation` requests of
    any method in any `window_seconds` (a moving window). Counted in `storage_url`: `memory://` counts per process
    (with N replicas a client may get up to N times as many), `redis://host:6379/0` counts once for all replicas.

    Requests that carry no credential at all (a forged form, an unknown state, a wrong API key) write at most
    `audit_per_address` audit rows per client and `audit_total` in all per window; then one `audit_suppressed`."""

    enabled: bool = True
    """Rate limits on the browser-facing routes (HTTP 429 with Retry-After over a limit)."""
    storage_url: str = Field(default="memory://", min_length=1)
    """Where requests are counted: memory:// per process, or a Redis URL (redis://host:6379/0) once for all
    replicas."""
    window_seconds: int = Field(default=60, gt=0, le=86400)
    """The window every limit counts requests of any method in (a moving window)."""
    connect_per_address: int = Field(default=60, gt=0)
    """Requests to the connect page per client address per window."""
    connect_per_elicitation: int = Field(default=30, gt=0)
    """Requests to the connect page per elicitation per window."""
    callback_per_address: int = Field(default=30, gt=0)
    """Provider callbacks (and identity returns) per client address per window."""
    callback_per_elicitation: int = Field(default=10, gt=0)
    """Provider callbacks (and identity returns) per authorization request per window."""
    confirm_per_address: int = Field(default=60, gt=0)
    """Calls to the confirm verifier's API per client address per window."""
    confirm_per_elicitation: int = Field(default=10, gt=0)
    """Calls to the confirm verifier's API per flow per window."""
    audit_per_address: int = Field(default=20, gt=0)
    """Audit rows per client address per window for requests that carry no credential at all."""
    audit_total: int = Field(default=600, gt=0)
    """Audit rows in all per window for such requests; then one audit_suppressed row."""

    @field_validator("storage_url")
    @classmethod
    def _check_storage(cls, value: str) -> str:
        scheme = value.partition("://")[0].strip().lower()
        if "://" not in value or scheme not in RATE_LIMIT_STORAGES:
            # The scheme only: a Redis URL may hold a password.
            raise ValueError(f"use memory:// or a Redis URL ({', '.join(s + '://' for s in RATE_LIMIT_STORAGES[1:])})")
        return value.strip()


class MetricsSettings(_Section):
    """`[metrics]`: Prometheus metrics at `/metrics`.

    On the public listener they are served only with `bearer_token` set (scrapers send it as a bearer token)
    or on a loopback deployment. With `port` set they are served on their own listener (`host`:`port`) instead,
    and not on the public one.
    """

    enabled: bool = True
    """Prometheus metrics at /metrics."""
    bearer_token: SecretStr | None = None
    """When set (environment only, at least 16 characters), /metrics needs Authorization: Bearer <token>."""
    host: str = Field(default="127.0.0.1", min_length=1)
    """Address of the metrics' own listener (with port)."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """When set, metrics are served only on their own listener (host:port), not on the public one."""

    @field_validator("bearer_token", "port", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return optional_secret(value)

    @field_validator("bearer_token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("too short: use at least 16 random characters")  # never echo the value
        return value


class ApiSettings(_Section):
    """`[api]`: the `/v1` API for agents (keys from `acp-connector api-keys create`) and its token proxy."""

    enabled: bool = True
    """The /v1 API for agents in other languages (with API keys) and its token proxy."""
    max_body_bytes: int = Field(default=16384, ge=1024, le=1048576)
    """Largest JSON body of the API itself."""
    max_wait_seconds: int = Field(default=60, ge=1, le=300)
    """The longest ?wait= long-poll."""
    proxy_retry_body_bytes: int = Field(default=1048576, ge=0)
    """Proxied request bodies up to this size are buffered, so a 401 can be retried after a refresh; larger ones
    stream through and a 401 is returned as it came."""
    proxy_max_request_bytes: int = Field(default=104857600, ge=0)
    """Largest request body the token proxy forwards."""
    proxy_max_response_bytes: int = Field(default=1073741824, ge=0)
    """Largest response body the token proxy returns."""
    proxy_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    """Proxy timeout to connect, and between two reads or writes."""
    proxy_max_seconds: float = Field(default=600.0, gt=0, le=86400)
    """Longest a whole proxied exchange may take."""
    events_keepalive_seconds: float = Field(default=15.0, ge=1, le=300)
    """An event stream (`GET /v1/events`) that sent nothing for this long sends a comment, so proxies keep it open.
    Each stream counts its own silence: other tenants' events do not count."""


class AdminSettings(_Section):
    """`[admin]`: the operator console under `/admin` (server-rendered pages) for operators, never agents.

    Operators sign in with OpenID Connect at the operator's identity provider (`oidc_discovery_url`, `oidc_client_id`,
    and `allowed_users` or `allowed_groups`), or scripts send the operator API key (`api_key`) as a bearer token.
    An agent's `/v1` API key is refused (403). With `port` set the console is served only on its own listener
    (`host`:`port`, keep it internal), not on the public one.
    """

    enabled: bool = False
    """Serve the operator console (it needs api_key or the OIDC sign-in settings)."""
    api_key: SecretStr | None = None
    """The operator API key for scripts (environment only, at least 32 characters), sent as Authorization: Bearer.
    Distinct from the agents' /v1 API keys."""
    host: str = Field(default="127.0.0.1", min_length=1)
    """Address of the console's own listener (with port)."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """When set, the console is served only on its own listener (host:port), not on the public one."""
    base_url: str | None = None
    """The URL operators' browsers reach the console's listener at (its OIDC redirect URI is <base_url>/admin/login/
    callback). Unset: public_base_url, or http://<host>:<port> with port set."""
    oidc_discovery_url: str | None = None
    """The operators' identity provider's discovery document (.../.well-known/openid-configuration)."""
    oidc_client_id: str | None = None
    """The console's client id at that identity provider."""
    oidc_client_secret: SecretStr | None = None
    """Its client secret, from the environment only; unset: a public client (PKCE only)."""
    oidc_scopes: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["openid", "email", "profile"])
    """Scopes requested at sign-in; openid is always included. Add the scope that releases the groups claim."""
    allowed_users: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Who may sign in: each entry a subject (`sub`) or a verified e-mail address."""
    allowed_groups: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Who may sign in: members of any of these groups (the `groups_claim` of the ID token or userinfo)."""
    groups_claim: str = Field(default="groups", min_length=1, max_length=64)
    """The claim listing an operator's groups."""
    session_seconds: int = Field(default=3600, ge=60, le=86400)
    """How long an operator's sign-in lasts."""
    page_size: int = Field(default=50, ge=1, le=500)
    """Rows per page of each list."""
    counts_max_age_seconds: float = Field(default=30.0, ge=0, le=3600)
    """How old the overview's grant counts and the keys page's counts may be (counting a million grants is a scan):
    older, the page shows the last count and one recount starts in the background. 0 counts on every view."""

    @field_validator(
        "api_key", "oidc_client_secret", "port", "base_url", "oidc_discovery_url", "oidc_client_id", mode="before"
    )
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return optional_secret(value)

    @field_validator("oidc_scopes", "allowed_users", "allowed_groups", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part for part in value.replace(",", " ").split() if part]
        return value

    @field_validator("api_key")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 32:
            raise ValueError("too short: use at least 32 random characters")  # never echo the value
        return value

    @model_validator(mode="after")
    def _usable(self) -> AdminSettings:
        if not self.enabled:
            return self
        oidc = self.oidc_discovery_url is not None
        if oidc != (self.oidc_client_id is not None):
            raise ValueError("set both oidc_discovery_url and oidc_client_id for the operators' sign-in")
        if oidc and not (self.allowed_users or self.allowed_groups):
            raise ValueError("set allowed_users or allowed_groups: nobody could sign in")
        if not oidc and self.api_key is None:
            raise ValueError("set api_key (CONNECTOR_ADMIN__API_KEY) or the OIDC sign-in settings")
        return self

    @property
    def oidc(self) -> bool:
        return self.oidc_discovery_url is not None


class GrantSettings(_Section):
    """`[grants]`: how grants are kept alive. After a refresh failed for a transient reason (5xx, 429, a timeout,
    no connection), the grant's next refresh waits, on every replica: a jittered wait that doubles with each failure
    in a row, from `refresh_retry_initial_seconds` up to `refresh_retry_max_seconds` (a provider's longer
    Retry-After is honoured up to that bound too). Meanwhile a call whose token has expired raises
    `ProviderUnavailable` without calling the provider."""

    refresh_retry_initial_seconds: float = Field(default=2.0, gt=0, le=3600)
    """The wait after the first transient refresh failure (drawn between half of it and all of it)."""
    refresh_retry_max_seconds: float = Field(default=300.0, gt=0, le=86400)
    """The longest wait between two refresh attempts of one grant."""
    proactive_refresh: bool = False
    """Refresh the access tokens of grants this replica used lately before they expire, in the background, so that
    an agent's call rarely waits on a refresh. Off: a token is refreshed when a call finds it due."""
    proactive_refresh_used_within_seconds: float = Field(default=3600.0, gt=0, le=30 * 86400)
    """Only grants this replica used within this many seconds are refreshed ahead (others wait for their next use)."""
    proactive_refresh_ahead_seconds: float = Field(default=300.0, gt=0, le=86400)
    """A grant's access token is refreshed ahead once it expires within this many seconds."""
    proactive_refresh_interval_seconds: float = Field(default=30.0, gt=0, le=3600)
    """How often this replica looks for tokens to refresh ahead."""
    proactive_refresh_concurrency: int = Field(default=4, ge=1, le=64)
    """How many refreshes ahead run at once on this replica."""

    def backoff(self) -> RefreshBackoff:
        """The refresh backoff, as plain values."""
        return RefreshBackoff(
            base=timedelta(seconds=self.refresh_retry_initial_seconds),
            cap=timedelta(seconds=self.refresh_retry_max_seconds),
        )

    def proactive(self) -> ProactivePolicy | None:
        """What is refreshed ahead, as plain values; None when `proactive_refresh` is off."""
        if not self.proactive_refresh:
            return None
        return ProactivePolicy(
            used_within=self.proactive_refresh_used_within_seconds,
            ahead=self.proactive_refresh_ahead_seconds,
            interval=self.proactive_refresh_interval_seconds,
            concurrency=self.proactive_refresh_concurrency,
        )


class TenantSettings(_Section):
    """`[tenants]`: which tenants share grants. A grant belongs to the tenant through which it was made (an API
    key's tenant, or `embedded`, the embedded connector's own): by default only that tenant sees, uses and revokes
    it, and only it hears the grant's events (stream and webhooks)."""

    shared_groups: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Groups of tenants that share their grants, each written as names joined by `+` (e.g. `embedded+billing-bot`:
    the embedded connector and the billing-bot key's agent see, use and revoke each other's grants). Empty: no
    tenant sees another's grants. In the environment: comma-separated groups."""

    @field_validator("shared_groups", mode="before")
    @classmethod
    def _split_groups(cls, value: Any) -> Any:
        return split_list(value)

    @field_validator("shared_groups")
    @classmethod
    def _check_groups(cls, value: list[str]) -> list[str]:
        TenantSharing.of(group.split("+") for group in value)  # ValueError names the wrong one
        return value

    def sharing(self) -> TenantSharing:
        """The sharing groups, as plain values."""
        return TenantSharing.of(group.split("+") for group in self.shared_groups)


class WebhookSettings(_Section):
    """`[webhooks]`: signed webhooks of the /v1 API (endpoints registered per API key with `POST /v1/webhooks` or
    `acp-connector webhooks create`)."""

    deliver: bool = True
    """Whether this replica makes webhook deliveries (any number of replicas may; each attempt is made by one)."""
    allow_private_addresses: bool = False
    """Allow endpoints on loopback, private, link-local or otherwise non-public addresses (and http to a loopback
    host). Off: such addresses are refused when an endpoint is registered and, after name resolution, before every
    attempt. For tests and local development only."""
    timeout_seconds: float = Field(default=10.0, gt=0, le=60)
    """The longest one attempt may take, connecting included."""
    retry_initial_seconds: float = Field(default=5.0, gt=0, le=3600)
    """The wait after the first failed attempt; it doubles with each failure (with jitter) up to retry_max_seconds."""
    retry_max_seconds: float = Field(default=3600.0, gt=0, le=86400)
    """The longest wait between two attempts."""
    max_age_seconds: float = Field(default=86400.0, gt=0, le=604800)
    """A delivery that has not succeeded this long after its event is given up (status `failed`)."""
    poll_interval_seconds: float = Field(default=1.0, gt=0, le=60)
    """How often a replica looks for due retries and for events other replicas logged (its own events are sent at
    once)."""

    def policy(self) -> WebhookPolicy:
        """How endpoints are checked and deliveries retried, as plain values."""
        return WebhookPolicy(
            allow_private_addresses=self.allow_private_addresses,
            timeout=timedelta(seconds=self.timeout_seconds),
            retry_initial=timedelta(seconds=self.retry_initial_seconds),
            retry_max=timedelta(seconds=self.retry_max_seconds),
            max_age=timedelta(seconds=self.max_age_seconds),
        )
