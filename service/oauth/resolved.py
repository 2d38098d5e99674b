"""`ResolvedProvider`: a catalog entry with every endpoint known. Protocol code only ever receives this type.

A catalog entry (`service.providers.ProviderEntry`) may name only a discovery URL; `ProviderGateway.resolve`
turns it into a `ResolvedProvider` (fetching and checking the discovery document). Refresh, revocation, the
consent page's CSP and outcomes take a `ResolvedProvider`, so an entry whose endpoints are not known yet
cannot reach them: mypy says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pydantic import SecretStr

from service.core.errors import ProviderError
from service.core.urls import host_of, url_problem
from service.providers import ProviderEntry, TokenEndpointAuthMethod
from service.providers.quirks import Quirks, fill, placeholders

from .client_auth import choose_auth_method
from .client_keys import ClientKeys


@dataclass(frozen=True, slots=True)
class ResolvedProvider:
    entry: ProviderEntry
    authorization_endpoint: str
    token_endpoint: str
    issuer: str | None
    userinfo_endpoint: str | None
    revocation_endpoint: str | None
    jwks_uri: str | None
    authorization_response_iss_parameter_supported: bool
    token_endpoint_auth_method: TokenEndpointAuthMethod
    auth_method_reason: str = "configured"  # why this method (`providers check` says it)
    par_endpoint: str | None = None  # RFC 9126's pushed_authorization_request_endpoint
    par_required: bool = False  # the provider's require_pushed_authorization_requests
    id_token_algorithms: tuple[str, ...] | None = None  # id_token_signing_alg_values_supported, when discovered
    discovered: bool = False  # endpoints came (partly) from a discovery document
    extra: Mapping[str, object] = field(default_factory=dict)  # other discovery metadata, for checks
    # The per-connection values the endpoints were filled with (`bound`): the agent's, the callback's, the
    # token response's. Empty: the catalog's templates as written.
    connection: Mapping[str, str] = field(default_factory=dict)
    # The connector's own signing keys (the gateway attaches them), for private_key_jwt.
    client_keys: ClientKeys | None = field(default=None, repr=False, compare=False)

    @property
    def par_reason(self) -> str | None:
        """Why authorization requests are pushed first (RFC 9126), or None when they are not."""
        if self.par_required:
            return "the provider requires it (require_pushed_authorization_requests)"
        if self.entry.pushed_authorization_requests:
            return "the catalog entry asks for it (pushed_authorization_requests)"
        return None

    def client_assertion(self) -> str:
        """A fresh private_key_jwt assertion for one request to this provider (ProviderError without keys)."""
        if self.client_keys is None:
            raise ProviderError(
                f"{self.display_name}: private_key_jwt needs the connector's signing key, and no vault is configured",
                code="provider_misconfigured",
            )
        audience = self.token_endpoint if self.entry.client_assertion_audience == "token_endpoint" else self.issuer
        return self.client_keys.assertion(self.client_id, audience or self.token_endpoint)

    def bound(self, values: Mapping[str, str]) -> ResolvedProvider:
        """This provider with `{name}` in its endpoints filled from the per-connection `values`.

        A filled endpoint that is not an https (or loopback) URL is a ProviderError `provider_token_error` naming
        the value, as it came from the provider or the agent."""
        merged = {**self.connection, **values}
        if not merged:
            return self
        names = merged
        filled: dict[str, str | None] = {}
        for key in _BOUND_FIELDS:
            template: str | None = getattr(self, key)
            if template is None or not placeholders(template) & set(names):
                continue
            url = fill(template, names)
            problem = url_problem(url)
            if problem is not None:
                used = ", ".join(sorted(placeholders(template) & set(names)))
                raise ProviderError(
                    f"{self.display_name}: the {key} built from {used} is not usable ({problem})",
                    code="provider_token_error",
                )
            filled[key] = url
        return dataclasses.replace(self, connection=MappingProxyType(merged), **filled)  # type: ignore[arg-type]

    @classmethod
    def from_entry(cls, entry: ProviderEntry) -> ResolvedProvider:
        """An entry whose endpoints are all written in the catalog (no discovery). A credential entry has no
        authorization server: its OAuth endpoints are empty and never used."""
        if entry.is_credential:
            return cls(
                entry=entry,
                authorization_endpoint="",
                token_endpoint="",
                issuer=None,
                userinfo_endpoint=None,
                revocation_endpoint=None,
                jwks_uri=None,
                authorization_response_iss_parameter_supported=False,
                token_endpoint_auth_method="none",  # noqa: S106 - a method name; there is no token endpoint
                auth_method_reason="a credential entry: no token endpoint",
            )
        assert entry.authorization_endpoint is not None and entry.token_endpoint is not None
        auth = choose_auth_method(entry.token_endpoint_auth_method, None, has_secret=entry.has_secret, discovered=False)
        return cls(
            entry=entry,
            authorization_endpoint=entry.authorization_endpoint,
            token_endpoint=entry.token_endpoint,
            issuer=entry.issuer,
            userinfo_endpoint=entry.userinfo_endpoint,
            revocation_endpoint=entry.revocation_endpoint,
            jwks_uri=entry.jwks_uri,
            par_endpoint=entry.pushed_authorization_request_endpoint,
            authorization_response_iss_parameter_supported=entry.authorization_response_iss_parameter_supported,
            token_endpoint_auth_method=auth.method,
            auth_method_reason=auth.reason,
        )

    # -- what the catalog says -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def display_name(self) -> str:
        """What people are shown: the catalog's display name, else the issuer's (or sign-in) host."""
        return self.entry.display_name or host_of(self.issuer) or host_of(self.authorization_endpoint) or self.name

    @property
    def discovery_url(self) -> str | None:
        return self.entry.discovery_url

    @property
    def default_scopes(self) -> tuple[str, ...]:
        return self.entry.default_scopes

    @property
    def dead_refresh_token_errors(self) -> tuple[str, ...]:
        return self.entry.dead_refresh_token_errors

    @property
    def client_id(self) -> str:
        assert self.entry.client_id is not None  # resolve() refuses entries without credentials
        return self.entry.client_id

    @property
    def client_secret(self) -> SecretStr | None:
        return self.entry.client_secret

    @property
    def oidc(self) -> bool:
        return self.entry.oidc

    @property
    def pkce(self) -> bool:
        return self.entry.pkce

    @property
    def api_base_url(self) -> str | None:
        """The API base, filled with the connection's values; None while a value it needs is unknown."""
        base = self.entry.api_base_url
        if base is None:
            return None
        if "{" not in base:
            return base
        filled = fill(base, self.connection)
        if placeholders(filled) or url_problem(filled) is not None:
            return None
        return filled

    @property
    def quirks(self) -> Quirks:
        return self.entry.quirks

    @property
    def account_id_field(self) -> str:
        return self.entry.account_id_field

    @property
    def account_prompt(self) -> str | None:
        """The `prompt` value that shows the provider's account chooser: the catalog's, else `select_account` when
        the discovery document lists it (OpenID Connect Discovery's prompt_values_supported); None: none known."""
        if self.entry.select_account_prompt is not None:
            return self.entry.account_prompt
        listed = self.extra.get("prompt_values_supported")
        return "select_account" if isinstance(listed, tuple) and "select_account" in listed else None

    @property
    def login_hint(self) -> str | None:
        return self.entry.login_hint

    @property
    def extra_authorize_params(self) -> Mapping[str, str]:
        return self.entry.extra_authorize_params

    @property
    def scope_aliases(self) -> Mapping[str, str]:
        return self.entry.scope_aliases

    def describe_scope(self, scope: str) -> str | None:
        return self.entry.describe_scope(scope)

    @property
    def sign_in_host(self) -> str:
        """The host the user is sent to (the consent page highlights it); for a credential entry, the API host
        that what the user types is sent to."""
        if self.entry.is_credential:
            return self.entry.api_host or ""
        return host_of(self.authorization_endpoint) or ""

    def join_scopes(self, scopes: Iterable[str]) -> str:
        return self.entry.join_scopes(scopes)


# Endpoints that may hold per-connection placeholders (`bound` fills them).
_BOUND_FIELDS = (
    "authorization_endpoint",
    "token_endpoint",
    "userinfo_endpoint",
    "revocation_endpoint",
    "jwks_uri",
    "issuer",
    "par_endpoint",
)


def callback_values(provider: ResolvedProvider, params: Mapping[str, str]) -> dict[str, str]:
    """The per-connection values the provider's callback carries, each checked (ProviderError naming it)."""
    values: dict[str, str] = {}
    for value in provider.quirks.values_from("callback"):
        assert value.parameter is not None  # the catalog requires it for this source
        text = params.get(value.parameter, "")
        problem = "is missing" if not text else ("is not usable" if value.problem(text) is not None else None)
        if problem is not None:
            raise ProviderError(
                f"{provider.display_name} callback's {value.parameter} {problem} "
                f"({provider.name}.connection.{value.name})",
                code="provider_callback_error",
            )
        values[value.name] = text
    return values
