"""The provider catalog: one `ProviderEntry` per OAuth provider, from providers.toml plus env credentials.

Endpoints come from the catalog file (or, for generic OIDC entries, from the provider's discovery document at
first use); client credentials come only from CONNECTOR_PROVIDER_<NAME>_CLIENT_ID / _CLIENT_SECRET.
This module never talks to a provider except to fetch a discovery document in `ProviderCatalog.resolve`.
"""

from __future__ import annotations

import asyncio
import os
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, StrictBool, StrictStr, ValidationError

from service.config import is_loopback_host
from service.errors import ConfigError, ConnectorError, ProviderNotConfigured, UnknownProvider

__all__ = [
    "DISCOVERY_FAILED",
    "ENDPOINT_FIELDS",
    "ProviderCatalog",
    "ProviderEntry",
    "TokenEndpointAuthMethod",
    "issuer_matches",
    "load_catalog",
    "provider_env_var",
]

TokenEndpointAuthMethod = Literal["client_secret_post", "client_secret_basic"]
_AUTH_METHODS: tuple[TokenEndpointAuthMethod, ...] = get_args(TokenEndpointAuthMethod)

DISCOVERY_FAILED = "provider_discovery_failed"
ENVIRONMENT = "environment"

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
_TENANT_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")
_DISCOVERY_TIMEOUT = httpx.Timeout(10.0)


def provider_env_var(name: str, suffix: str) -> str:
    """`CONNECTOR_PROVIDER_<NAME>_<SUFFIX>`, NAME upper-cased with '-' as '_'; SUFFIX e.g. CLIENT_ID."""
    return f"CONNECTOR_PROVIDER_{name.upper().replace('-', '_')}_{suffix.upper()}"


def _host(url: str | None) -> str | None:
    if not url:
        return None
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None


def issuer_matches(expected: str, received: str, *, tenant_id: str | None = None) -> bool:
    """Whether `received` is the expected issuer: exact string equality (OpenID Connect, RFC 9207).

    An `expected` with `{tenantid}` accepts any tenant id in that place, or exactly `tenant_id` when given.
    """
    if TENANT_ID_PLACEHOLDER not in expected:
        return received == expected
    prefix, _, suffix = expected.partition(TENANT_ID_PLACEHOLDER)
    if not (received.startswith(prefix) and received.endswith(suffix)) or len(received) < len(prefix) + len(suffix):
        return False
    tenant = received[len(prefix) : len(received) - len(suffix)]
    if not _TENANT_ID_RE.fullmatch(tenant):
        return False
    return tenant_id is None or tenant == tenant_id


def _endpoint_problem(url: str) -> str | None:
    """Why `url` is not acceptable as an endpoint, or None if it is (no value is ever quoted back)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return "is not a valid URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an absolute https URL"
    if parts.username is not None or parts.password is not None:
        return "must not contain user credentials"
    if parts.fragment or "#" in url:
        return "must not have a fragment"
    if parts.scheme != "https" and not is_loopback_host(parts.hostname):
        return "must use https unless the host is loopback (127.0.0.1, ::1, localhost)"
    return None


@dataclass(frozen=True)
class ProviderEntry:
    """One OAuth provider: where its endpoints are, what it expects, and (from the environment) our client."""

    name: str
    display_name: str
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
    token_endpoint_auth_method: TokenEndpointAuthMethod = "client_secret_post"  # noqa: S105 - a method name
    client_id: str | None = None
    client_secret: SecretStr | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.scope_separator:
            raise ValueError("scope_separator must not be empty")
        if self.token_endpoint_auth_method not in _AUTH_METHODS:
            raise ValueError(f"token_endpoint_auth_method must be one of {', '.join(_AUTH_METHODS)}")
        object.__setattr__(self, "default_scopes", tuple(self.default_scopes))
        object.__setattr__(self, "extra_authorize_params", MappingProxyType(dict(self.extra_authorize_params)))

    @property
    def has_credentials(self) -> bool:
        return bool(self.client_id) and self.client_secret is not None and bool(self.client_secret.get_secret_value())

    @property
    def has_endpoints(self) -> bool:
        """Endpoints are known, or can be discovered."""
        return bool(self.authorization_endpoint and self.token_endpoint) or bool(self.discovery_url)

    @property
    def configured(self) -> bool:
        return self.has_credentials and self.has_endpoints

    @property
    def api_host(self) -> str | None:
        return _host(self.api_base_url)

    @property
    def provider_host(self) -> str | None:
        """Host the user is sent to (for the consent page); the discovery host until resolved."""
        return _host(self.authorization_endpoint) or _host(self.discovery_url)

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
        self._resolved: dict[str, ProviderEntry] = {}
        self._locks: dict[str, asyncio.Lock] = {}

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

    async def resolve(self, name: str, http: httpx.AsyncClient) -> ProviderEntry:
        """The configured entry with every endpoint known: discovery entries are fetched once, then cached."""
        entry = self.require_configured(name)
        if entry.discovery_url is None:
            return entry
        cached = self._resolved.get(name)
        if cached is not None:
            return cached
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            cached = self._resolved.get(name)
            if cached is None:
                cached = await _discover(entry, entry.discovery_url, http)
                self._resolved[name] = cached
        return cached


def _discovery_error(entry: ProviderEntry, url: str, problem: str) -> ConnectorError:
    return ConnectorError(f"provider {entry.name!r}: discovery at {url} failed: {problem}", code=DISCOVERY_FAILED)


def _expected_issuer(discovery_url: str) -> str | None:
    """The issuer a discovery URL implies (OIDC Discovery 1.0 §4, RFC 8414 §3), if of a known form."""
    parts = urlsplit(discovery_url)
    oidc_suffix = "/.well-known/openid-configuration"
    if parts.path.endswith(oidc_suffix):
        return f"{parts.scheme}://{parts.netloc}{parts.path[: -len(oidc_suffix)]}"
    rfc8414_prefix = "/.well-known/oauth-authorization-server"
    if parts.path == rfc8414_prefix or parts.path.startswith(rfc8414_prefix + "/"):
        return f"{parts.scheme}://{parts.netloc}{parts.path[len(rfc8414_prefix) :]}"
    return None


def _same_issuer(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


async def _discover(entry: ProviderEntry, url: str, http: httpx.AsyncClient) -> ProviderEntry:
    try:
        response = await http.get(url, headers={"Accept": "application/json"}, timeout=_DISCOVERY_TIMEOUT)
    except httpx.HTTPError as exc:
        raise _discovery_error(entry, url, f"request error ({type(exc).__name__})") from None
    if response.status_code != 200:
        raise _discovery_error(entry, url, f"HTTP status {response.status_code}")
    try:
        document: Any = response.json()
    except ValueError:
        raise _discovery_error(entry, url, "the response is not JSON") from None
    if not isinstance(document, dict):
        raise _discovery_error(entry, url, "the response is not a JSON object")

    def text(key: str, *, required: bool) -> str | None:
        value = document.get(key)
        if value is None or value == "":
            if required:
                raise _discovery_error(entry, url, f"the document has no {key}")
            return None
        if not isinstance(value, str):
            raise _discovery_error(entry, url, f"{key} is not a string")
        problem = _endpoint_problem(value)
        if problem is not None:
            raise _discovery_error(entry, url, f"{key} {problem}")
        return value

    issuer = text("issuer", required=True)
    assert issuer is not None
    implied = _expected_issuer(url)
    if implied is not None and not _same_issuer(issuer, implied):
        raise _discovery_error(entry, url, f"the document's issuer {issuer} does not match its location ({implied})")
    if entry.issuer is not None and not _same_issuer(issuer, entry.issuer):
        raise _discovery_error(entry, url, f"the document's issuer {issuer} is not the configured {entry.issuer}")

    authorization_endpoint = text("authorization_endpoint", required=True)
    token_endpoint = text("token_endpoint", required=True)
    userinfo_endpoint = text("userinfo_endpoint", required=False)
    revocation_endpoint = text("revocation_endpoint", required=False)
    jwks_uri = text("jwks_uri", required=False)

    iss_supported = document.get("authorization_response_iss_parameter_supported", False)
    if not isinstance(iss_supported, bool):
        raise _discovery_error(entry, url, "authorization_response_iss_parameter_supported is not a boolean")
    if entry.oidc and not (entry.jwks_uri or jwks_uri):
        raise _discovery_error(entry, url, "the document has no jwks_uri, needed to check ID tokens")

    auth_method = entry.token_endpoint_auth_method
    methods = document.get("token_endpoint_auth_methods_supported")
    if methods is not None:
        if not isinstance(methods, list):
            raise _discovery_error(entry, url, "token_endpoint_auth_methods_supported is not a list")
        if auth_method not in methods:
            usable = [method for method in _AUTH_METHODS if method in methods]
            if not usable:
                raise _discovery_error(
                    entry,
                    url,
                    f"the provider supports none of {', '.join(_AUTH_METHODS)} at its token endpoint",
                )
            auth_method = usable[0]

    # Endpoints written in the catalog win over discovered ones (operators can pin them); the issuer is the
    # document's exact string, as ID tokens and RFC 9207 `iss` carry it.
    return replace(
        entry,
        issuer=issuer,
        authorization_endpoint=entry.authorization_endpoint or authorization_endpoint,
        token_endpoint=entry.token_endpoint or token_endpoint,
        userinfo_endpoint=entry.userinfo_endpoint or userinfo_endpoint,
        revocation_endpoint=entry.revocation_endpoint or revocation_endpoint,
        jwks_uri=entry.jwks_uri or jwks_uri,
        authorization_response_iss_parameter_supported=iss_supported,
        token_endpoint_auth_method=auth_method,
    )


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
    token_endpoint_auth_method: TokenEndpointAuthMethod = "client_secret_post"  # noqa: S105 - a method name
    tenant: StrictStr | None = None


_SECRET_KEYS = ("client_id", "client_secret")
# Optional text keys: an empty string means "not set", since TOML has no null.
_OPTIONAL_TEXT = frozenset({*ENDPOINT_FIELDS, "display_name", "tenant"})
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


def _dotted(name: str, loc: tuple[str | int, ...]) -> str:
    key = name
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else f".{part}"
    return key


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


def _build_entry(name: str, raw: Any, environ: Mapping[str, str], file: str) -> ProviderEntry:
    if not _NAME_RE.fullmatch(name):
        raise ConfigError(
            file, name, "provider names are lower-case letters, digits, '-' and '_', starting with a letter"
        )
    if not isinstance(raw, dict):
        raise ConfigError(file, name, f"expected a [{name}] table describing the provider")
    for secret_key in _SECRET_KEYS:
        if secret_key in raw:
            raise ConfigError(
                file,
                f"{name}.{secret_key}",
                "client credentials never go in the catalog file: set "
                f"{provider_env_var(name, 'CLIENT_ID')} and {provider_env_var(name, 'CLIENT_SECRET')} "
                "in the environment",
            )
    try:
        table = _ProviderTable.model_validate(
            {key: _blank_is_none(value) if key in _OPTIONAL_TEXT else value for key, value in raw.items()}
        )
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        problem = "unknown key" if error["type"] == "extra_forbidden" else error["msg"].removeprefix("Value error, ")
        raise ConfigError(file, _dotted(name, tuple(error["loc"])), problem) from None

    values: dict[str, Any] = table.model_dump()
    # Where a value came from, for errors: the file unless the environment set it.
    sources: dict[str, str] = {}

    tenant_var = provider_env_var(name, "TENANT")
    tenant = environ.get(tenant_var) or table.tenant or _DEFAULT_TENANT
    if not _TENANT_RE.fullmatch(tenant):
        origin = ENVIRONMENT if environ.get(tenant_var) else file
        raise ConfigError(origin, f"{name}.tenant", "must be a tenant id or domain (letters, digits, '.', '-')")

    discovery_var = provider_env_var(name, "DISCOVERY_URL")
    if environ.get(discovery_var):
        values["discovery_url"] = environ[discovery_var].strip()
        sources["discovery_url"] = ENVIRONMENT

    for key in ENDPOINT_FIELDS:
        written: str | None = values.get(key)
        if written is None:
            continue
        origin = sources.get(key, file)
        url = _fill_placeholders(written, tenant, file=origin, key=f"{name}.{key}")
        url_problem = _endpoint_problem(url)
        if url_problem is not None:
            suffix = f" (set by {discovery_var})" if origin == ENVIRONMENT else ""
            raise ConfigError(origin, f"{name}.{key}", url_problem + suffix)
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
        raise ConfigError(
            file,
            f"{name}.extra_authorize_params",
            f"may not set {', '.join(sorted(reserved))}: the connector sets those itself",
        )

    client_id = (environ.get(provider_env_var(name, "CLIENT_ID")) or "").strip() or None
    client_secret_text = environ.get(provider_env_var(name, "CLIENT_SECRET")) or ""
    client_secret = SecretStr(client_secret_text.strip()) if client_secret_text.strip() else None

    values.pop("tenant")
    values["display_name"] = values["display_name"] or name
    values["default_scopes"] = tuple(values["default_scopes"])
    return ProviderEntry(name=name, client_id=client_id, client_secret=client_secret, **values)


def load_catalog(path: Path, env: Mapping[str, str] | None = None) -> ProviderCatalog:
    """Read providers.toml and attach credentials from `env` (default os.environ). Raises ConfigError."""
    environ: Mapping[str, str] = os.environ if env is None else env
    file = str(path)
    data = _read_catalog_file(path)
    entries = [_build_entry(name, raw, environ, file) for name, raw in data.items()]
    return ProviderCatalog(entries, source=file)
