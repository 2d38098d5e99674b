"""`ProviderEntry` (one OAuth provider: endpoints, what it expects, its quirks, our client) and `ProviderCatalog`."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, get_args

from pydantic import SecretStr

from service.core.errors import FlowRefused, ProviderNotConfigured, UnknownProvider
from service.core.urls import host_of

from .credentials import CredentialSpec
from .quirks import Quirks

EntryKind = Literal["oauth", "api_key", "basic"]
TokenEndpointAuthMethod = Literal["client_secret_basic", "client_secret_post", "private_key_jwt", "none"]
# Where a private_key_jwt assertion is addressed: the issuer (RFC 7523bis, FAPI 2.0) or the token endpoint.
AssertionAudience = Literal["issuer", "token_endpoint"]
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
    "pushed_authorization_request_endpoint",
)

NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
# In `issuer` only: a multi-tenant provider (Microsoft Entra ID) puts the user's tenant id here; an ID token's
# `iss` must then carry the same id as its `tid` claim. Microsoft's discovery documents use the same notation.
TENANT_ID_PLACEHOLDER = "{tenantid}"


# The CONNECTOR_PROVIDER_<NAME>_<SUFFIX> variables a catalog entry reads.
PROVIDER_ENV_SUFFIXES = ("CLIENT_ID", "CLIENT_SECRET", "DISCOVERY_URL", "TENANT")


def provider_env_var(name: str, suffix: str) -> str:
    """`CONNECTOR_PROVIDER_<NAME>_<SUFFIX>`, NAME upper-cased with '-' as '_'; SUFFIX e.g. CLIENT_ID."""
    return f"CONNECTOR_PROVIDER_{name.upper().replace('-', '_')}_{suffix.upper()}"


# OpenID Connect Core §5.4 and §11: the scopes every OpenID provider gives the same meaning.
OPENID_SCOPE_DESCRIPTIONS = {
    "openid": "Confirm who you are (your account's identifier).",
    "profile": "Your name and basic profile details.",
    "email": "Your email address.",
    "address": "Your postal address.",
    "phone": "Your phone number.",
    "offline_access": "Keep access while you are away, until you disconnect or revoke it.",
}


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
    # PAR (RFC 9126): push every authorization request first (also done whenever the provider's metadata requires it)
    pushed_authorization_requests: bool = False
    pushed_authorization_request_endpoint: str | None = None  # without discovery; discovery's otherwise
    # DPoP (RFC 9449): tokens bound to a key per grant, a proof on every token request and API call
    dpop: bool = False
    # The FAPI 2.0 Security Profile: PAR, PKCE S256, private_key_jwt, DPoP and RFC 9207 `iss`, all of them; the
    # catalog turns the others on, and an entry whose provider cannot do one of them is refused (oauth.discovery).
    fapi2: bool = False
    # Resource indicators (RFC 8707): the APIs the token is asked for, sent on the authorization and token requests.
    resource: tuple[str, ...] = ()
    # Whether the userinfo endpoint is asked for the profile when the ID token names the account: unset, yes
    # unless `resource` binds the token to another API (a provider's userinfo may refuse such a token).
    userinfo: bool | None = None
    account_id_field: str = "id"
    extra_authorize_params: Mapping[str, str] = field(default_factory=dict, hash=False)
    # Several accounts per provider (service.core.accounts): the `prompt` value that shows the provider's account
    # chooser, sent when the user adds an account (unset: `select_account` when the provider's discovery document
    # lists it in prompt_values_supported), and the authorization parameter that names the account to sign in with,
    # sent when an account is asked again (unset: `login_hint` for an OpenID provider, OpenID Connect Core
    # §3.1.2.1). "" turns either off.
    select_account_prompt: str | None = None
    login_hint_parameter: str | None = None
    # A scope as asked -> the name the provider's token response gives it (Google answers `email` with
    # https://www.googleapis.com/auth/userinfo.email): either counts as granted.
    scope_aliases: Mapping[str, str] = field(default_factory=dict, hash=False)
    # A scope -> what it gives, in words, for the consent page (`describe_scope`).
    scope_descriptions: Mapping[str, str] = field(default_factory=dict, hash=False)
    token_endpoint_auth_method: TokenEndpointAuthMethod | None = None  # unset: chosen at resolution (oauth)
    client_assertion_audience: AssertionAudience = "issuer"
    client_id: str | None = None
    client_secret: SecretStr | None = field(default=None, repr=False)
    # Described only by CONNECTOR_PROVIDERS__<NAME>__* variables: the catalog file has no table of this name.
    environment_only: bool = False
    quirks: Quirks = field(default_factory=Quirks, hash=False)
    docs_url: str | None = None  # the provider's documentation: where to register the app, what it publishes
    kind: EntryKind = "oauth"
    # kind "api_key" / "basic": the fields the user types on the connector's page, their injection and check.
    credential: CredentialSpec | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if not self.scope_separator:
            raise ValueError("scope_separator must not be empty")
        if self.token_endpoint_auth_method is not None and self.token_endpoint_auth_method not in _AUTH_METHODS:
            raise ValueError(f"token_endpoint_auth_method must be one of {', '.join(_AUTH_METHODS)}")
        object.__setattr__(self, "default_scopes", tuple(self.default_scopes))
        object.__setattr__(self, "resource", tuple(self.resource))
        object.__setattr__(self, "extra_authorize_params", MappingProxyType(dict(self.extra_authorize_params)))
        object.__setattr__(self, "scope_aliases", MappingProxyType(dict(self.scope_aliases)))
        object.__setattr__(self, "scope_descriptions", MappingProxyType(dict(self.scope_descriptions)))

    @property
    def account_prompt(self) -> str | None:
        """The declared `prompt` value that lets the user pick the account at the provider (None: none declared;
        a discovered provider may still list `select_account`, `ResolvedProvider.account_prompt`)."""
        return self.select_account_prompt or None

    @property
    def login_hint(self) -> str | None:
        """The authorization parameter naming the account to sign in with (None: none is known)."""
        declared = self.login_hint_parameter
        return (declared if declared is not None else ("login_hint" if self.oidc else None)) or None

    @property
    def is_credential(self) -> bool:
        """A credential entry (API key, HTTP Basic): the user types it on the connector's page; no OAuth."""
        return self.credential is not None

    @property
    def has_secret(self) -> bool:
        return self.client_secret is not None and bool(self.client_secret.get_secret_value())

    @property
    def has_credentials(self) -> bool:
        """A client id, and a secret unless the operator declared a public client (`none`, PKCE only) or one that
        signs its own assertions (`private_key_jwt`, with the connector's key from the vault). A credential entry
        needs none: the user brings the credential."""
        if self.is_credential:
            return True
        return bool(self.client_id) and (
            self.has_secret or self.token_endpoint_auth_method in ("none", "private_key_jwt")
        )

    def describe_scope(self, scope: str) -> str | None:
        """What `scope` gives, in words: the entry's `scope_descriptions`, else OpenID Connect's standard scopes
        for an OpenID provider; None when neither says."""
        described = self.scope_descriptions.get(scope)
        if described is None and self.oidc:
            described = OPENID_SCOPE_DESCRIPTIONS.get(scope)
        return described

    @property
    def has_endpoints(self) -> bool:
        """Endpoints are known, or can be discovered (a credential entry: its API base)."""
        if self.is_credential:
            return bool(self.api_base_url)
        return bool(self.authorization_endpoint and self.token_endpoint) or bool(self.discovery_url)

    @property
    def configured(self) -> bool:
        return self.has_credentials and self.has_endpoints

    @property
    def api_host(self) -> str | None:
        return host_of(self.api_base_url)

    @property
    def provider_host(self) -> str | None:
        """Host the user is sent to (for the consent page); the discovery host until resolved. A credential entry's
        is its API host: where what the user types goes."""
        if self.is_credential:
            return self.api_host
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
            or host_of(self.api_base_url if self.is_credential else None)
            or self.name
        )

    @property
    def client_id_env_var(self) -> str:
        return provider_env_var(self.name, "CLIENT_ID")

    @property
    def client_secret_env_var(self) -> str:
        return provider_env_var(self.name, "CLIENT_SECRET")

    @property
    def dead_refresh_token_errors(self) -> tuple[str, ...]:
        """Refresh errors that mean the user must authorize again (`token_response.dead_refresh_token_errors`)."""
        return self.quirks.token_response.dead_refresh_token_errors

    def connection_values(self, given: Mapping[str, str] | None) -> dict[str, str]:
        """The per-connection values an agent gives at `request_authorization`, checked and with defaults filled.

        Raises FlowRefused `missing_connection_value` or `invalid_connection_value` naming the value."""
        given = dict(given or {})
        values: dict[str, str] = {}
        for value in self.quirks.values_from("agent"):
            text = given.pop(value.name, None) or value.default
            if text is None:
                raise FlowRefused(
                    "missing_connection_value",
                    detail={"name": value.name, "message": f"{self.name} needs {value.name}: {value.description}"},
                )
            problem = value.problem(text)
            if problem is not None:
                raise FlowRefused("invalid_connection_value", detail={"name": value.name, "message": problem})
            values[value.name] = text
        if given:
            unknown = ", ".join(sorted(given))
            raise FlowRefused(
                "invalid_connection_value",
                detail={"name": unknown, "message": f"{self.name} takes no per-connection value {unknown}"},
            )
        return values

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
        if entry.is_credential:
            if not entry.api_base_url:
                raise ProviderNotConfigured(f"provider {name!r} has no api_base_url in {self.source}")
            return entry
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
