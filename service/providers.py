"""The provider catalog: one `ProviderEntry` per OAuth provider, from providers.toml plus env credentials.

Endpoints come from the catalog file (or, for generic OIDC entries, from the provider's discovery document, which
`service.oauth` fetches); every key of a provider's table can also be set (or overridden) by
`CONNECTOR_PROVIDERS__<NAME>__<KEY>`; client credentials come only from CONNECTOR_PROVIDER_<NAME>_CLIENT_ID /
_CLIENT_SECRET. This module never talks to a provider.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, StrictBool, StrictStr, ValidationError

from service.config.origins import ENVIRONMENT, dotted_key
from service.core.errors import ConfigError, ProviderNotConfigured, UnknownProvider
from service.core.urls import host_of, url_problem

__all__ = [
    "ENDPOINT_FIELDS",
    "PROVIDER_ENV_SUFFIXES",
    "ProviderCatalog",
    "ProviderEntry",
    "TokenEndpointAuthMethod",
    "load_catalog",
    "provider_env_var",
    "provider_setting_env_var",
    "provider_setting_env_vars",
]

TokenEndpointAuthMethod = Literal["client_secret_basic", "client_secret_post", "none"]
_AUTH_METHODS: tuple[TokenEndpointAuthMethod, ...] = get_args(TokenEndpointAuthMethod)

# Fields that hold URLs: each must be https unless its host is loopback.
ENDPOINT_FIELDS: tuple[str, ...] = (
    "authorization_endpoint",
    "token_endpoint",
    "revocation_endpoint",
    "userinfo_endpoint",
    "api_base_url",
    "issuer",
    "discovery_url",
    "jwks_uri",
)

_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,127}$")
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")
_DEFAULT_TENANT = "common"
# In `issuer` only: a multi-tenant provider (Microsoft Entra ID) puts the user's tenant id here; an ID token's
# `iss` must then carry the same id as its `tid` claim. Microsoft's discovery documents use the same notation.
TENANT_ID_PLACEHOLDER = "{tenantid}"


# The CONNECTOR_PROVIDER_<NAME>_<SUFFIX> variables a catalog entry reads.
PROVIDER_ENV_SUFFIXES = ("CLIENT_ID", "CLIENT_SECRET", "DISCOVERY_URL", "TENANT")


def provider_env_var(name: str, suffix: str) -> str:
    """`CONNECTOR_PROVIDER_<NAME>_<SUFFIX>`, NAME upper-cased with '-' as '_'; SUFFIX e.g. CLIENT_ID."""
    return f"CONNECTOR_PROVIDER_{name.upper().replace('-', '_')}_{suffix.upper()}"


@dataclass(frozen=True)
class ProviderEntry:
    """One OAuth provider: where its endpoints are, what it expects, and (from the environment) our client."""

    name: str
    display_name: str | None = None  # what people are shown; unset: the provider's host (`shown_name`)
    authorization_endpoint: str | None = None
    token_endpoint: str | None = None
    revocation_endpoint: str | None = None
    userinfo_endpoint: str | None = None
    api_base_url: str | None = None
    default_scopes: tuple[str, ...] = ()
    scope_separator: str = " "
    pkce: bool = True
    oidc: bool = False
    issuer: str | None = None
    authorization_response_iss_parameter_supported: bool = False
    discovery_url: str | None = None
    jwks_uri: str | None = None  # the provider's signing keys, for ID tokens (OpenID Connect)
    account_id_field: str = "id"
    extra_authorize_params: Mapping[str, str] = field(default_factory=dict, hash=False)
    # A scope as asked -> the name the provider's token response gives it (Google answers `email` with
    # https://www.googleapis.com/auth/userinfo.email): either counts as granted.
    scope_aliases: Mapping[str, str] = field(default_factory=dict, hash=False)
    token_endpoint_auth_method: TokenEndpointAuthMethod | None = None  # unset: chosen at resolution (oauth)
    # OAuth errors of a refresh that mean the refresh token is dead and the user must authorize again (RFC 6749's
    # invalid_grant, and a provider's own form such as GitHub's bad_refresh_token, which comes with HTTP 200).
    dead_refresh_token_errors: tuple[str, ...] = ("invalid_grant",)
    client_id: str | None = None
    client_secret: SecretStr | None = field(default=None, repr=False)
    # Described only by CONNECTOR_PROVIDERS__<NAME>__* variables: the catalog file has no table of this name.
    environment_only: bool = False

    def __post_init__(self) -> None:
        if not self.scope_separator:
            raise ValueError("scope_separator must not be empty")
        if self.token_endpoint_auth_method is not None and self.token_endpoint_auth_method not in _AUTH_METHODS:
            raise ValueError(f"token_endpoint_auth_method must be one of {', '.join(_AUTH_METHODS)}")
        object.__setattr__(self, "default_scopes", tuple(self.default_scopes))
        object.__setattr__(self, "dead_refresh_token_errors", tuple(self.dead_refresh_token_errors))
        object.__setattr__(self, "extra_authorize_params", MappingProxyType(dict(self.extra_authorize_params)))
        object.__setattr__(self, "scope_aliases", MappingProxyType(dict(self.scope_aliases)))

    @property
    def has_secret(self) -> bool:
        return self.client_secret is not None and bool(self.client_secret.get_secret_value())

    @property
    def has_credentials(self) -> bool:
        """A client id, and a secret unless the operator declared a public client (`none`, PKCE only)."""
        return bool(self.client_id) and (self.has_secret or self.token_endpoint_auth_method == "none")  # noqa: S105

    @property
    def has_endpoints(self) -> bool:
        """Endpoints are known, or can be discovered."""
        return bool(self.authorization_endpoint and self.token_endpoint) or bool(self.discovery_url)

    @property
    def configured(self) -> bool:
        return self.has_credentials and self.has_endpoints

    @property
    def api_host(self) -> str | None:
        return host_of(self.api_base_url)

    @property
    def provider_host(self) -> str | None:
        """Host the user is sent to (for the consent page); the discovery host until resolved."""
        return host_of(self.authorization_endpoint) or host_of(self.discovery_url)

    @property
    def shown_name(self) -> str:
        """What people are shown before discovery: the display name, else the issuer's (or sign-in) host.

        The catalog key is an operator's label and is shown only when the entry names no host at all (it then
        cannot be connected either)."""
        return (
            self.display_name
            or host_of(self.issuer)
            or host_of(self.discovery_url)
            or host_of(self.authorization_endpoint)
            or self.name
        )

    @property
    def client_id_env_var(self) -> str:
        return provider_env_var(self.name, "CLIENT_ID")

    @property
    def client_secret_env_var(self) -> str:
        return provider_env_var(self.name, "CLIENT_SECRET")

    def join_scopes(self, scopes: Iterable[str]) -> str:
        """The `scope` parameter for this provider: scopes in order, duplicates and blanks dropped."""
        seen: dict[str, None] = {}
        for scope in scopes:
            if scope.strip():
                seen.setdefault(scope.strip(), None)
        return self.scope_separator.join(seen)


class ProviderCatalog:
    """The providers this connector knows, by name. Immutable; `resolve` caches discovered endpoints."""

    def __init__(self, entries: Iterable[ProviderEntry], *, source: str = "<memory>") -> None:
        self._entries: dict[str, ProviderEntry] = {}
        for entry in entries:
            if entry.name in self._entries:
                raise ValueError(f"provider {entry.name!r} is defined twice")
            self._entries[entry.name] = entry
        self.source = source

    def __repr__(self) -> str:
        return f"ProviderCatalog(source={self.source!r}, providers={sorted(self._entries)!r})"

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[ProviderEntry]:
        return iter(self.entries())

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, name: str) -> ProviderEntry:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "none"
            raise UnknownProvider(f"unknown provider {name!r} (known: {known})") from None

    def require_configured(self, name: str) -> ProviderEntry:
        entry = self.get(name)
        if not entry.has_credentials:
            raise ProviderNotConfigured(
                f"provider {name!r} has no client credentials: set {entry.client_id_env_var} "
                f"and {entry.client_secret_env_var}"
            )
        if not entry.has_endpoints:
            raise ProviderNotConfigured(
                f"provider {name!r} has no endpoints: set {provider_env_var(name, 'DISCOVERY_URL')}, or "
                f"discovery_url (or authorization_endpoint and token_endpoint) in {self.source}"
            )
        return entry

    def entries(self) -> list[ProviderEntry]:
        return [self._entries[name] for name in sorted(self._entries)]


# --- loading the catalog file ----------------------------------------------------------------------------


def _blank_is_none(value: Any) -> Any:
    if isinstance(value, str) and not value.strip():
        return None
    return value


class _ProviderTable(BaseModel):
    """One `[name]` table of providers.toml, as written (before placeholders and environment)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    display_name: StrictStr | None = None
    authorization_endpoint: StrictStr | None = None
    token_endpoint: StrictStr | None = None
    revocation_endpoint: StrictStr | None = None
    userinfo_endpoint: StrictStr | None = None
    api_base_url: StrictStr | None = None
    default_scopes: list[StrictStr] = Field(default_factory=list)
    scope_separator: StrictStr = Field(default=" ", min_length=1)
    pkce: StrictBool = True
    oidc: StrictBool = False
    issuer: StrictStr | None = None
    authorization_response_iss_parameter_supported: StrictBool = False
    discovery_url: StrictStr | None = None
    jwks_uri: StrictStr | None = None
    account_id_field: StrictStr = Field(default="id", min_length=1)
    extra_authorize_params: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    scope_aliases: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    token_endpoint_auth_method: TokenEndpointAuthMethod | None = None
    dead_refresh_token_errors: list[StrictStr] = Field(default_factory=lambda: ["invalid_grant"])
    tenant: StrictStr | None = None


_SECRET_KEYS = ("client_id", "client_secret")
# Optional text keys: an empty string means "not set", since TOML has no null.
_OPTIONAL_TEXT = frozenset({*ENDPOINT_FIELDS, "display_name", "tenant", "token_endpoint_auth_method"})
_RESERVED_AUTHORIZE_PARAMS = frozenset(
    {
        "client_id",
        "redirect_uri",
        "response_type",
        "scope",
        "state",
        "nonce",
        "code_challenge",
        "code_challenge_method",
    }
)


def _read_catalog_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(str(path), "<file>", "provider catalog not found (providers.catalog)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), "<toml>", f"not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(str(path), "<file>", f"cannot be read: {exc.strerror or exc}") from None


def _fill_placeholders(value: str, tenant: str, *, file: str, key: str) -> str:
    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == TENANT_ID_PLACEHOLDER and key.endswith(".issuer"):
            return TENANT_ID_PLACEHOLDER  # kept: filled per ID token from its `tid` claim
        if match.group(1) != "tenant":
            problem = f"unknown placeholder {{{match.group(1)}}}: only {{tenant}} is supported ({{tenantid}} in issuer)"
            raise ConfigError(file, key, problem)
        return tenant

    return _PLACEHOLDER_RE.sub(substitute, value)


# `CONNECTOR_PROVIDERS__<NAME>__<KEY>`: one catalog key of one provider, from the environment.
PROVIDERS_ENV_PREFIX = "CONNECTOR_PROVIDERS__"
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def provider_setting_env_vars(name: str) -> list[str]:
    """Every `CONNECTOR_PROVIDERS__<NAME>__<KEY>` variable that sets a catalog key of provider `name`."""
    return [provider_setting_env_var(name, key) for key in _ProviderTable.model_fields]


def provider_setting_env_var(name: str, key: str) -> str:
    """`CONNECTOR_PROVIDERS__<NAME>__<KEY>`, NAME and KEY upper-cased, '-' in NAME written as '_'."""
    return f"{PROVIDERS_ENV_PREFIX}{name.upper().replace('-', '_')}__{key.upper()}"


def _env_tables(environ: Mapping[str, str]) -> dict[str, dict[str, tuple[str, str]]]:
    """Provider settings in the environment: {NAME (lower case): {key: (variable, value)}}."""
    tables: dict[str, dict[str, tuple[str, str]]] = {}
    for variable, value in environ.items():
        if not variable.upper().startswith(PROVIDERS_ENV_PREFIX) or value == "":
            continue
        parts = variable[len(PROVIDERS_ENV_PREFIX) :].split("__")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            continue  # e.g. CONNECTOR_PROVIDERS__CATALOG, a setting of the connector
        tables.setdefault(parts[0].lower(), {})[parts[1].lower()] = (variable, value)
    return tables


def _from_env_text(key: str, text: str) -> Any:
    """An environment value as the catalog key's type: true/false, a list (JSON or comma-separated), a JSON table."""
    field = _ProviderTable.model_fields.get(key)
    default = field.get_default(call_default_factory=True) if field is not None else None
    text = text.strip()
    if isinstance(default, bool):
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError("must be true or false")
    if isinstance(default, list):
        if text.startswith("["):
            return _json_value(text, "a JSON list of strings")
        return [part for part in text.replace(",", " ").split() if part]
    if isinstance(default, dict):
        return _json_value(text, 'a JSON object, e.g. {"prompt": "consent"}')
    return text


def _json_value(text: str, expected: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise ValueError(f"must be {expected}") from None


def _build_entry(
    name: str, raw: Any, environ: Mapping[str, str], file: str, from_env: Mapping[str, tuple[str, str]]
) -> ProviderEntry:
    if not _NAME_RE.fullmatch(name):
        raise ConfigError(
            file, name, "provider names are lower-case letters, digits, '-' and '_', starting with a letter"
        )
    if not isinstance(raw, dict):
        raise ConfigError(file, name, f"expected a [{name}] table describing the provider")
    for secret_key in _SECRET_KEYS:
        if secret_key in raw or secret_key in from_env:
            origin = ENVIRONMENT if secret_key in from_env else file
            raise ConfigError(
                origin,
                f"{name}.{secret_key}",
                "client credentials are read only from "
                f"{provider_env_var(name, 'CLIENT_ID')} and {provider_env_var(name, 'CLIENT_SECRET')} "
                "(never from the catalog file, which is meant to be committed)",
            )

    # Where each key came from, for errors: the file unless the environment set it.
    set_by: dict[str, str] = {}

    def origin_of(key: str) -> tuple[str, str]:
        """(file or "environment", " (set by VAR)" or "") for errors about `key`."""
        variable = set_by.get(key)
        return (ENVIRONMENT, f" (set by {variable})") if variable is not None else (file, "")

    merged = dict(raw)
    # The older single-variable overrides, then `CONNECTOR_PROVIDERS__<NAME>__<KEY>` (which wins).
    for key in ("discovery_url", "tenant"):
        variable = provider_env_var(name, key)
        if environ.get(variable, "").strip():
            merged[key], set_by[key] = environ[variable].strip(), variable
    for key, (variable, text) in from_env.items():
        set_by[key] = variable
        try:
            merged[key] = _from_env_text(key, text)
        except ValueError as exc:
            raise ConfigError(ENVIRONMENT, f"{name}.{key}", f"{exc} (set by {variable})") from None
    try:
        table = _ProviderTable.model_validate(
            {key: _blank_is_none(value) if key in _OPTIONAL_TEXT else value for key, value in merged.items()}
        )
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        problem = "unknown key" if error["type"] == "extra_forbidden" else error["msg"].removeprefix("Value error, ")
        origin, suffix = origin_of(str(error["loc"][0]))
        raise ConfigError(origin, dotted_key((name, *error["loc"])), problem + suffix) from None

    values: dict[str, Any] = table.model_dump()
    tenant = table.tenant or _DEFAULT_TENANT
    if not _TENANT_RE.fullmatch(tenant):
        origin, suffix = origin_of("tenant")
        raise ConfigError(
            origin, f"{name}.tenant", "must be a tenant id or domain (letters, digits, '.', '-')" + suffix
        )

    for key in ENDPOINT_FIELDS:
        written: str | None = values.get(key)
        if written is None:
            continue
        origin, suffix = origin_of(key)
        url = _fill_placeholders(written, tenant, file=origin, key=f"{name}.{key}")
        url_error = url_problem(url)
        if url_error is not None:
            raise ConfigError(origin, f"{name}.{key}", url_error + suffix)
        values[key] = url

    if not values.get("discovery_url"):
        # Without discovery nothing can fill these in later: the checks they enable would silently not happen.
        if values["authorization_response_iss_parameter_supported"] and not values.get("issuer"):
            raise ConfigError(
                file, f"{name}.issuer", "is required when authorization_response_iss_parameter_supported is true"
            )
        if values["oidc"] and values.get("authorization_endpoint"):
            for needed in ("issuer", "jwks_uri"):
                if not values.get(needed):
                    raise ConfigError(
                        file, f"{name}.{needed}", "is required for an OpenID Connect provider (oidc = true)"
                    )

    reserved = _RESERVED_AUTHORIZE_PARAMS.intersection(values["extra_authorize_params"])
    if reserved:
        origin, suffix = origin_of("extra_authorize_params")
        raise ConfigError(
            origin,
            f"{name}.extra_authorize_params",
            f"may not set {', '.join(sorted(reserved))}: the connector sets those itself" + suffix,
        )

    client_id = (environ.get(provider_env_var(name, "CLIENT_ID")) or "").strip() or None
    client_secret_text = environ.get(provider_env_var(name, "CLIENT_SECRET")) or ""
    client_secret = SecretStr(client_secret_text.strip()) if client_secret_text.strip() else None

    values.pop("tenant")
    values["default_scopes"] = tuple(values["default_scopes"])
    return ProviderEntry(name=name, client_id=client_id, client_secret=client_secret, **values)


def load_catalog(path: Path, env: Mapping[str, str] | None = None) -> ProviderCatalog:
    """Read providers.toml, apply `CONNECTOR_PROVIDERS__<NAME>__<KEY>` and attach credentials from `env` (default
    os.environ). A NAME the file does not have adds a provider described by the environment alone.
    Raises ConfigError."""
    environ: Mapping[str, str] = os.environ if env is None else env
    file = str(path)
    data = _read_catalog_file(path)
    from_env = _env_tables(environ)
    by_env_name = {name.replace("-", "_"): name for name in data}
    environment_only = [name for name in from_env if name not in by_env_name]
    for name in environment_only:
        data[name] = {}
    entries = [
        _build_entry(name, raw, environ, file, from_env.get(name.replace("-", "_"), {})) for name, raw in data.items()
    ]
    return ProviderCatalog(
        (replace(entry, environment_only=True) if entry.name in environment_only else entry for entry in entries),
        source=file,
    )
