"""One `[name]` table of providers.toml as written (pydantic models: keys, types, and nothing unknown)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator

from .credentials import CheckRequest, CredentialField, Injection
from .entry import AssertionAudience, EntryKind, TokenEndpointAuthMethod
from .quirks import (
    AccountSource,
    ApiAuth,
    ConnectionValue,
    LegacyTokenExchange,
    Quirks,
    RefreshTokens,
    RequestEncoding,
    Revocation,
    TokenRequest,
    TokenResponseShape,
    UserinfoMethod,
    ValueSource,
    pointer_problem,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ConnectionValueTable(_Strict):
    """`[name.connection.<value>]`: a per-connection value, where it comes from and what it must look like."""

    source: ValueSource
    pattern: StrictStr = Field(min_length=1)
    description: StrictStr = ""
    example: StrictStr = ""
    pointer: StrictStr | None = None
    parameter: StrictStr | None = None
    default: StrictStr | None = None
    secret: StrictBool = False

    @field_validator("pointer")
    @classmethod
    def _pointer(cls, value: str | None) -> str | None:
        problem = pointer_problem(value) if value is not None else None
        if problem is not None:
            raise ValueError(problem)
        return value


# What the consent page says a scope gives: one printable sentence, short enough to read at a glance.
ScopeDescription = Annotated[StrictStr, Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]


class ProviderTable(_Strict):
    """One `[name]` table of providers.toml, as written (before placeholders and environment)."""

    kind: EntryKind = "oauth"
    display_name: StrictStr | None = None
    docs_url: StrictStr | None = None
    authorization_endpoint: StrictStr | None = None
    token_endpoint: StrictStr | None = None
    revocation_endpoint: StrictStr | None = None
    userinfo_endpoint: StrictStr | None = None
    userinfo_method: UserinfoMethod = "GET"
    userinfo_body: StrictStr | None = None
    scope_parameter: StrictStr = Field(default="scope", pattern=r"^[a-z_]{1,32}$")
    api_base_url: StrictStr | None = None
    api_token_header: StrictStr = Field(default="Authorization", min_length=1)
    api_token_prefix: StrictStr = "Bearer "
    default_scopes: list[StrictStr] = Field(default_factory=list)
    scope_separator: StrictStr = Field(default=" ", min_length=1)
    pkce: StrictBool = True
    oidc: StrictBool = False
    issuer: StrictStr | None = None
    authorization_response_iss_parameter_supported: StrictBool = False
    discovery_url: StrictStr | None = None
    jwks_uri: StrictStr | None = None
    pushed_authorization_requests: StrictBool = False
    pushed_authorization_request_endpoint: StrictStr | None = None
    dpop: StrictBool = False
    fapi2: StrictBool = False
    resource: list[StrictStr] = Field(default_factory=list)
    userinfo: StrictBool | None = None
    account_id_field: StrictStr = Field(default="id", min_length=1)
    account_id_source: AccountSource = "userinfo"
    extra_authorize_params: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    select_account_prompt: StrictStr | None = Field(default=None, pattern=r"^[a-z_]{0,32}$")
    login_hint_parameter: StrictStr | None = Field(default=None, pattern=r"^[a-z_]{0,32}$")
    extra_token_params: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    extra_refresh_params: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    token_request_encoding: RequestEncoding = "form"
    refresh_tokens: RefreshTokens = "reusable"
    legacy_token_exchange: LegacyTokenExchange | None = None
    scope_aliases: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    scope_descriptions: dict[StrictStr, ScopeDescription] = Field(default_factory=dict)
    token_endpoint_auth_method: TokenEndpointAuthMethod | None = None
    client_assertion_audience: AssertionAudience = "issuer"
    tenant: StrictStr | None = None
    # Also token_response.dead_refresh_token_errors; this key (read by grant health before quirks had a table) wins.
    dead_refresh_token_errors: list[StrictStr] | None = None
    token_response: TokenResponseShape = Field(default_factory=TokenResponseShape)
    revocation: Revocation = Field(default_factory=Revocation)
    connection: dict[StrictStr, ConnectionValueTable] = Field(default_factory=dict)
    # Credential entries (kind = "api_key" / "basic"): see service.providers.credentials.
    fields: dict[StrictStr, CredentialField] = Field(default_factory=dict)
    inject: list[Injection] = Field(default_factory=list)
    check: CheckRequest | None = None
    revoke_url: StrictStr | None = None

    def quirks(self) -> Quirks:
        return Quirks(
            token_request=TokenRequest(
                encoding=self.token_request_encoding,
                exchange_params=self.extra_token_params,
                refresh_params=self.extra_refresh_params,
                refresh_tokens=self.refresh_tokens,
                legacy_exchange=self.legacy_token_exchange,
            ),
            token_response=self.token_response
            if self.dead_refresh_token_errors is None
            else self.token_response.model_copy(
                update={"dead_refresh_token_errors": tuple(self.dead_refresh_token_errors)}
            ),
            revocation=self.revocation,
            api_auth=ApiAuth(self.api_token_header, self.api_token_prefix),
            userinfo_method=self.userinfo_method,
            userinfo_body=self.userinfo_body,
            scope_parameter=self.scope_parameter,
            account_id_source=self.account_id_source,
            connection=tuple(
                ConnectionValue(name=name, **value.model_dump()) for name, value in self.connection.items()
            ),
        )


# Keys that are not fields of `ProviderEntry` as such: they become its `quirks`.
QUIRK_KEYS = frozenset(
    {
        "userinfo_method",
        "userinfo_body",
        "scope_parameter",
        "api_token_header",
        "api_token_prefix",
        "account_id_source",
        "extra_token_params",
        "extra_refresh_params",
        "token_request_encoding",
        "refresh_tokens",
        "legacy_token_exchange",
        "token_response",
        "revocation",
        "connection",
        "dead_refresh_token_errors",
    }
)
# Keys of a credential entry, not fields of `ProviderEntry` as such: they become its `credential`.
CREDENTIAL_KEYS = frozenset({"fields", "inject", "check", "revoke_url"})
# Keys only an OAuth entry may set (a credential entry has no authorization server).
OAUTH_ONLY_KEYS = (
    "authorization_endpoint",
    "token_endpoint",
    "revocation_endpoint",
    "userinfo_endpoint",
    "discovery_url",
    "issuer",
    "jwks_uri",
    "default_scopes",
    "legacy_token_exchange",
)
