"""Settings: the connector's configuration from a TOML file and CONNECTOR_* environment variables.

Precedence is environment > TOML file > defaults. `load_settings` is the only entry point that reads files;
every problem it finds becomes a `ConfigError` naming the file (or "environment") and the dotted key, never
the value.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import logging
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings.exceptions import SettingsError

from service.core.errors import ConfigError
from service.core.urls import is_loopback_host, url_problem

__all__ = [
    "CONFIG_ENV_VAR",
    "DEFAULT_CONFIG_PATH",
    "ENV_NESTED_DELIMITER",
    "ENV_PREFIX",
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
    "Settings",
    "VaultSettings",
    "WebhookSettings",
    "load_settings",
    "nearest",
    "optional_secret",
    "optional_str",
    "setting_env_var",
    "setting_field",
    "setting_paths",
    "split_list",
    "unknown_key_problem",
]

log = logging.getLogger("service.config")

ENV_PREFIX = "CONNECTOR_"
ENV_NESTED_DELIMITER = "__"
CONFIG_ENV_VAR = "CONNECTOR_CONFIG"
DEFAULT_CONFIG_PATH = Path("config/connector.toml")
ENVIRONMENT = "environment"

# The loader hands the TOML file and the environment to `Settings.settings_customise_sources` through these,
# so that a plain `Settings()` still works (os.environ, no file) and concurrent loads do not interfere.
_toml_file: ContextVar[Path | None] = ContextVar("connector_toml_file", default=None)
_environ: ContextVar[Mapping[str, str] | None] = ContextVar("connector_environ", default=None)

# Keys of the TOML file that are refused although they name settings, with the reason.
_FORBIDDEN_TOML_KEYS: dict[tuple[str, ...], str] = {
    ("config_file",): "unknown key: config_file is set by the loader, not read from the file",
    ("vault", "keys"): (
        "key material does not belong in the config file: use vault.key_file (a file only its owner can "
        "read) or the CONNECTOR_VAULT__KEYS environment variable"
    ),
    ("metrics", "bearer_token"): (
        "the metrics token does not belong in the config file: set CONNECTOR_METRICS__BEARER_TOKEN"
    ),
    ("identity", "oidc", "client_secret"): (
        "client secrets do not belong in the config file: set CONNECTOR_IDENTITY__OIDC__CLIENT_SECRET"
    ),
}


def nearest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to `name` (a likely typo), or None when none is close."""
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def optional_str(value: Any) -> Any:
    """An empty or blank string means "not set" (TOML has no null)."""
    if isinstance(value, str) and not value.strip():
        return None
    return value


def optional_secret(value: Any) -> Any:
    """`optional_str` for a secret field, which may arrive already wrapped (a `SecretStr` default or model)."""
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    return optional_str(value)


class _Section(BaseModel):
    # Each field's docstring is its description (docs/reference.md is generated from them).
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ServerSettings(_Section):
    host: str = Field(default="127.0.0.1", min_length=1)
    """Address the HTTP server listens on. 127.0.0.1 keeps it private to this machine; 0.0.0.0 (behind a
    TLS-terminating proxy that serves public_base_url) accepts connections from elsewhere."""
    port: int = Field(default=8700, ge=1, le=65535)
    """Port the HTTP server listens on."""
    trusted_proxies: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Reverse proxies (CIDR networks) whose forwarded headers are believed: X-Forwarded-For for the client address
    (rate limits) and, with the trusted_header verifier, the identity headers. Empty: none are believed. In the
    environment: comma-separated."""

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _split_networks(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

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
    """Rows deleted per transaction when retention is applied."""
    interval_seconds: float = Field(default=300.0, gt=0)
    """How often the running service applies retention (`acp-connector purge` applies it at once)."""


def split_list(value: Any) -> Any:
    """A comma-separated string (the environment's way to give a list) becomes a list of its non-empty parts."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class IdentitySettings(BaseModel):
    """`[identity]`: which verifier learns who is in the browser. Each verifier's own settings are in
    `[identity.<name>]` (e.g. `[identity.oidc]`), validated by that verifier (`service.identity`)."""

    model_config = ConfigDict(extra="allow", frozen=True, use_attribute_docstrings=True)

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

    model_config = ConfigDict(extra="allow", frozen=True, use_attribute_docstrings=True)

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


class Settings(BaseSettings):
    """All settings of one connector. Build it with `load_settings`; it is immutable once built."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        env_ignore_empty=True,
        case_sensitive=False,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )

    public_base_url: str = "http://127.0.0.1:8700"
    """The URL at which browsers reach this service: links and the OAuth redirect URIs are built from it. https
    unless the host is loopback; no query or fragment."""
    agent_name: str = Field(default="ACP agent", min_length=1)
    """The agent's name as the user sees it on the consent page."""
    log_format: Literal["text", "json"] = "text"
    """Log line format: text for people, json for log collectors (one object per line). --log-format overrides it."""
    demo: bool = False
    """Development demo (`acp-connector serve --demo`, `make run`): / offers a link that starts an authorization for
    the local verifier's user without an agent. Loopback deployments with the local verifier only."""
    server: ServerSettings = Field(default_factory=ServerSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    elicitation: ElicitationSettings = Field(default_factory=ElicitationSettings)
    events: EventsSettings = Field(default_factory=EventsSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    identity: IdentitySettings = Field(default_factory=IdentitySettings)
    vault: VaultSettings = Field(default_factory=VaultSettings)
    providers: ProvidersSettings = Field(default_factory=ProvidersSettings)
    rate_limit: RateLimitSettings = Field(default_factory=RateLimitSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    replicas: ReplicaSettings = Field(default_factory=ReplicaSettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)
    config_file: Path | None = None

    @field_validator("public_base_url")
    @classmethod
    def _check_public_base_url(cls, value: str) -> str:
        value = value.strip()
        problem = url_problem(value, allow_query=False)
        if problem is not None:
            raise ValueError(problem)
        return value.rstrip("/")

    # The CONNECTOR_* variables the loader read (names and values; never in a repr). Provider credentials come
    # from here too, so `load_settings(env=...)` governs everything.
    _env: dict[str, str] = PrivateAttr(
        default_factory=lambda: {k: v for k, v in os.environ.items() if v != "" and k.upper().startswith(ENV_PREFIX)}
    )

    _warned: set[tuple[str, str]] = PrivateAttr(default_factory=set)

    def environment(self) -> Mapping[str, str]:
        """The CONNECTOR_* environment these settings were loaded with."""
        return dict(self._env)

    def origin(self, loc: tuple[str, ...]) -> str:
        """Where the setting at `loc` came from: the CONNECTOR_* variable that set it, else the file."""
        env_var = _env_var_for(loc, self._env)
        if env_var is not None:
            return env_var
        nested = setting_env_var(loc) + ENV_NESTED_DELIMITER  # a table set key by key from the environment
        setters = sorted(name for name in self._env if name.upper().startswith(nested))
        if setters:
            return setters[0]
        return str(self.config_file) if self.config_file is not None else ENVIRONMENT

    def config_error(self, loc: tuple[str, ...], problem: str) -> ConfigError:
        """A ConfigError about the setting at `loc`, naming the environment variable or the file that set it."""
        env_var = _env_var_for(loc, self._env)
        if env_var is not None:
            return ConfigError(ENVIRONMENT, _dotted(loc), f"{problem} (set by {env_var})")
        return ConfigError(
            str(self.config_file) if self.config_file is not None else ENVIRONMENT, _dotted(loc), problem
        )

    def section_error(
        self, prefix: tuple[str, ...], exc: ValidationError, model: type[BaseModel] | None = None
    ) -> ConfigError:
        """A ConfigError for the first problem pydantic found in the section at `prefix` (validated by `model`,
        whose fields an unknown key is compared with)."""
        error = exc.errors(include_url=False, include_input=False)[0]
        loc = (*prefix, *(str(part) for part in error["loc"]))
        valid = list(model.model_fields) if model is not None and len(error["loc"]) == 1 else []
        return self.config_error(loc, _problem(error, lambda _: valid))

    def warn(self, key: str, message: str) -> None:
        """Log a configuration warning about `key` on `service.config`, once for these settings (and copies)."""
        if (key, message) in self._warned:
            return
        self._warned.add((key, message))
        log.warning(message, extra={"config_key": key})

    @property
    def public_host(self) -> str:
        """Host name of `public_base_url`."""
        return urlsplit(self.public_base_url).hostname or ""

    @property
    def is_loopback_deployment(self) -> bool:
        """True when both the listening address and the public URL are loopback: a single-machine setup."""
        return is_loopback_host(self.server.host) and is_loopback_host(self.public_host)

    def demo_problem(self) -> str | None:
        """Why `demo` cannot be on with these settings, or None."""
        if not self.demo:
            return None
        if not self.is_loopback_deployment:
            return (
                "the demo starts authorizations without an agent, so it runs on a loopback deployment only "
                f"(server.host is '{self.server.host}', public_base_url's host is '{self.public_host}')"
            )
        if self.identity.verifier != "local":
            return f"the demo acts for the local verifier's user, but identity.verifier is '{self.identity.verifier}'"
        return None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        environ = _environ.get()
        env_source = env_settings if environ is None else _MappingEnvSource(settings_cls, environ)
        toml_file = _toml_file.get()
        if toml_file is None:
            return init_settings, env_source
        return init_settings, env_source, TomlConfigSettingsSource(settings_cls, toml_file=toml_file)


def setting_paths(model: type[BaseModel] | None = None, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every setting as its path of keys, e.g. `("server", "port")`, in declaration order.

    The `[identity.<name>]` tables are not included: each verifier plugin declares its own (`settings_model`).
    """
    paths: list[tuple[str, ...]] = []
    for name, field in (model or Settings).model_fields.items():
        if name == "config_file":
            continue
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths.extend(setting_paths(annotation, (*prefix, name)))
        else:
            paths.append((*prefix, name))
    return paths


def setting_env_var(path: Sequence[str]) -> str:
    """The environment variable of a setting or section: `("server", "port")` -> `CONNECTOR_SERVER__PORT`."""
    return (ENV_PREFIX + ENV_NESTED_DELIMITER.join(path)).upper()


def setting_field(path: Sequence[str]) -> FieldInfo:
    """The pydantic field of a setting path (for its type, default and description)."""
    model: type[BaseModel] = Settings
    for part in path[:-1]:
        annotation = model.model_fields[part].annotation
        assert isinstance(annotation, type) and issubclass(annotation, BaseModel)
        model = annotation
    return model.model_fields[path[-1]]


def _keys_at(loc: Sequence[str | int]) -> list[str]:
    """The valid keys of the section at `loc` (the top level for `()`), empty when `loc` is not a section."""
    model: type[BaseModel] = Settings
    for part in loc:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return [name for name in model.model_fields if name != "config_file"]


def unknown_key_problem(key: str, valid: Iterable[str]) -> str:
    """ "unknown key", with the nearest valid key when one is close."""
    close = nearest(key, valid)
    return f"unknown key: did you mean '{close}'?" if close else "unknown key"


class _MappingEnvSource(EnvSettingsSource):
    """The environment source, reading a given mapping instead of os.environ."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._given_environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {key.lower(): value for key, value in self._given_environ.items() if value != ""}


@contextmanager
def _sources(toml_file: Path | None, environ: Mapping[str, str]) -> Iterator[None]:
    file_token = _toml_file.set(toml_file)
    env_token = _environ.set(environ)
    try:
        yield
    finally:
        _toml_file.reset(file_token)
        _environ.reset(env_token)


def _env_var_for(loc: tuple[str | int, ...], environ: Mapping[str, str]) -> str | None:
    """The CONNECTOR_* variable that supplied the value at `loc`, if any (nested or whole-section JSON)."""
    names = [part for part in loc if isinstance(part, str)]
    present = {key.upper(): key for key, value in environ.items() if value != ""}
    for depth in range(len(names), 0, -1):
        candidate = (ENV_PREFIX + ENV_NESTED_DELIMITER.join(names[:depth])).upper()
        if candidate in present:
            return present[candidate]
    return None


def _dotted(loc: tuple[str | int, ...]) -> str:
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        else:
            key += ("." if key else "") + part
    return key or "<settings>"


def _problem(error: ErrorDetails, valid_keys: Callable[[tuple[str | int, ...]], Iterable[str]] = _keys_at) -> str:
    if error["type"] == "extra_forbidden":
        loc = tuple(error["loc"])
        return unknown_key_problem(str(loc[-1]), valid_keys(loc[:-1]) if loc else ())
    message = error["msg"]
    return message.removeprefix("Value error, ")


def _config_error_from_validation(exc: ValidationError, file: Path | None, environ: Mapping[str, str]) -> ConfigError:
    error = exc.errors(include_url=False, include_input=False)[0]
    return _config_error_at(tuple(error["loc"]), _problem(error), file, environ)


def _config_error_at(
    loc: tuple[str | int, ...], problem: str, file: Path | None, environ: Mapping[str, str]
) -> ConfigError:
    env_var = _env_var_for(loc, environ)
    if env_var is not None:
        return ConfigError(ENVIRONMENT, _dotted(loc), f"{problem} (set by {env_var})")
    return ConfigError(str(file) if file is not None else ENVIRONMENT, _dotted(loc), problem)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        # The decoder's message names line and column but never quotes the content.
        raise ConfigError(str(path), "<toml>", f"not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(str(path), "<file>", f"cannot be read: {exc.strerror or exc}") from None
    providers = data.get("providers")
    if isinstance(providers, dict):
        for key, value in providers.items():
            if isinstance(value, dict):
                raise ConfigError(
                    str(path),
                    f"providers.{key}",
                    "provider tables belong in the catalog file (providers.catalog) or in "
                    "CONNECTOR_PROVIDERS__<NAME>__<KEY> environment variables",
                )
    for key_path, reason in _FORBIDDEN_TOML_KEYS.items():
        node: Any = data
        for part in key_path:
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            raise ConfigError(str(path), ".".join(key_path), reason)
    return data


def _choose_config_file(path: str | Path | None, environ: Mapping[str, str]) -> Path | None:
    if path is not None:
        chosen = Path(path)
    elif environ.get(CONFIG_ENV_VAR):
        chosen = Path(environ[CONFIG_ENV_VAR])
    elif DEFAULT_CONFIG_PATH.is_file():
        return DEFAULT_CONFIG_PATH
    else:
        return None
    if not chosen.is_file():
        origin = CONFIG_ENV_VAR if path is None else "the given path"
        raise ConfigError(str(chosen), "<file>", f"config file not found (from {origin})")
    return chosen


def _resolve_relative(value: Path, base: Path | None, set_by_env: bool) -> Path:
    """Relative paths written in the file are relative to the file; those from the environment to the cwd."""
    if value.is_absolute() or base is None or set_by_env:
        return value
    return Path(os.path.normpath(base / value))


def load_settings(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Load settings from `path`, else $CONNECTOR_CONFIG, else config/connector.toml if it exists.

    Without a file: defaults and the environment only. `env` replaces os.environ (tests, embedding).
    Raises ConfigError on the first problem found.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    config_file = _choose_config_file(path, environ)
    if config_file is not None:
        _read_toml(config_file)  # syntax and forbidden keys, with a clear error, before pydantic sees it
    try:
        with _sources(config_file, environ):
            settings = Settings()
    except ValidationError as exc:
        raise _config_error_from_validation(exc, config_file, environ) from None
    except SettingsError as exc:
        # Raised by pydantic-settings when an environment value cannot be decoded (e.g. bad JSON). Its message
        # names the top-level field, never the value.
        match = re.search(r'field "([^"]+)"', str(exc))
        key = match.group(1) if match else "<environment>"
        env_var = (ENV_PREFIX + key).upper() if match else "a CONNECTOR_* variable"
        raise ConfigError(ENVIRONMENT, key, f"{env_var} (or one of its {env_var}__* parts) cannot be parsed") from None

    for key, value in (settings.identity.model_extra or {}).items():
        if not isinstance(value, dict):  # only [identity.<name>] tables are free-form; any other key is a typo
            problem = unknown_key_problem(key, _keys_at(("identity",)))
            raise _config_error_at(("identity", key), problem, config_file, environ)

    demo_problem = settings.demo_problem()
    if demo_problem is not None:
        raise _config_error_at(("demo",), demo_problem, config_file, environ)

    base = config_file.resolve().parent if config_file is not None else None
    key_file = settings.vault.key_file
    if key_file is not None:
        key_file = _resolve_relative(key_file, base, _env_var_for(("vault", "key_file"), environ) is not None)
    catalog = _resolve_relative(
        settings.providers.catalog, base, _env_var_for(("providers", "catalog"), environ) is not None
    )
    loaded = settings.model_copy(
        update={
            "vault": settings.vault.model_copy(update={"key_file": key_file}),
            "providers": settings.providers.model_copy(update={"catalog": catalog}),
            "config_file": config_file.resolve() if config_file is not None else None,
        }
    )
    loaded._env = {key: value for key, value in environ.items() if value != "" and key.upper().startswith(ENV_PREFIX)}
    for key, value in (loaded.providers.model_extra or {}).items():
        if not isinstance(value, dict):  # a provider table (CONNECTOR_PROVIDERS__<NAME>__<KEY>) is a dict
            raise loaded.config_error(("providers", key), "unknown key")
    return loaded
