"""How a provider bends the spec, as data: where its token response keeps things, how its endpoints are called,
which per-connection values its URLs need and where each comes from. One code path (`service.oauth`) reads these;
a provider is added by one providers.toml table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator

RequestEncoding = Literal["form", "json"]
ExpiryForm = Literal["seconds", "milliseconds", "epoch_seconds", "never"]
RefreshTokens = Literal["none", "reusable", "rotating"]
ValueSource = Literal["agent", "token_response", "callback"]
RevocationAuth = Literal["client", "basic", "bearer"]
RevocationMethod = Literal["POST", "DELETE"]
RevokedToken = Literal["refresh_first", "access"]
AccountSource = Literal["userinfo", "token_response"]
UserinfoMethod = Literal["GET", "POST"]

EXPIRY_FORMS: tuple[ExpiryForm, ...] = get_args(ExpiryForm)
REFRESH_TOKENS: tuple[RefreshTokens, ...] = get_args(RefreshTokens)
VALUE_SOURCES: tuple[ValueSource, ...] = get_args(ValueSource)

_MISSING = object()


def resolve_pointer(document: Any, pointer: str) -> Any:
    """The value at an RFC 6901 JSON pointer ("" is the whole document), or None where there is none."""
    if pointer == "":
        return document
    current = document
    for raw in pointer[1:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(current, Mapping):
            current = current.get(part, _MISSING)
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return None
        if current is _MISSING:
            return None
    return current


def pointer_problem(pointer: str) -> str | None:
    """Why `pointer` is not an RFC 6901 JSON pointer, or None."""
    if pointer and not pointer.startswith("/"):
        return f"{pointer!r} is not a JSON pointer (it starts with '/', e.g. /authed_user/access_token)"
    return None


class _Table(BaseModel):
    """A sub-table of a providers.toml entry: its keys as written, nothing unknown; frozen once read."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _pointer(value: str | None) -> str | None:
    problem = pointer_problem(value) if value is not None else None
    if problem is not None:
        raise ValueError(problem)
    return value


class TokenResponseShape(_Table):
    """`[name.token_response]`: where a token response keeps each member (JSON pointers) and how it gives expiry
    and errors."""

    access_token: StrictStr = "/access_token"
    refresh_token: StrictStr = "/refresh_token"
    token_type: StrictStr = "/token_type"
    scope: StrictStr = "/scope"
    id_token: StrictStr = "/id_token"
    expires: StrictStr = "/expires_in"
    expires_form: ExpiryForm = "seconds"
    error: StrictStr = "/error"  # an OAuth error code, in an answer of any status (a 200 too)
    ok_flag: StrictStr | None = None  # a member that is false when the answer is an error (Slack's `ok`)
    # Documented error codes the provider answers with HTTP 200 (GitHub's bad_verification_code): data for
    # operators and for classifying refresh failures; any error at `error` is refused whatever its status.
    errors_with_200: tuple[StrictStr, ...] = ()
    # Errors of a refresh that mean the refresh token is dead (the user must authorize again).
    dead_refresh_token_errors: tuple[StrictStr, ...] = ("invalid_grant",)

    _pointers = field_validator(
        "access_token", "refresh_token", "token_type", "scope", "id_token", "expires", "error", "ok_flag"
    )(_pointer)

    def members(self) -> dict[str, str]:
        """The non-default pointers, for listings."""
        default = TokenResponseShape()
        return {
            name: str(getattr(self, name))
            for name in ("access_token", "refresh_token", "token_type", "scope", "id_token", "expires", "error")
            if getattr(self, name) != getattr(default, name)
        }


# RFC 8693 §2.1: the grant type of a token exchange, and the parameters the connector sets itself on one.
TOKEN_EXCHANGE_GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
_EXCHANGE_RESERVED = frozenset(
    {
        "grant_type",
        "subject_token",
        "subject_token_type",
        "requested_token_type",
        "actor_token",
        "actor_token_type",
        "client_id",
        "client_secret",
        "client_assertion",
        "client_assertion_type",
        "refresh_token",
        "code",
    }
)


_TOKEN_TYPE = r"^[\x21-\x7e]+$"  # a token type is a URI (RFC 8693 §3): printable, no spaces


class LegacyTokenExchange(_Table):
    """`legacy_token_exchange = {...}`: how a grant stored with a non-expiring access token and no refresh token is
    migrated, with no user, to an expiring token and a refresh token: an RFC 8693 token exchange at the token
    endpoint, the stored access token as the subject token (Shopify's migration to expiring offline tokens)."""

    subject_token_type: StrictStr = Field(min_length=1, max_length=200, pattern=_TOKEN_TYPE)
    requested_token_type: StrictStr | None = Field(default=None, min_length=1, max_length=200, pattern=_TOKEN_TYPE)
    encoding: RequestEncoding = "form"  # RFC 8693 §2.1 is a form; a provider's own library may send JSON
    params: dict[StrictStr, StrictStr] = {}  # extra parameters of the exchange (Shopify's expiring = "1")

    @field_validator("params")
    @classmethod
    def _not_reserved(cls, value: dict[str, str]) -> dict[str, str]:
        reserved = _EXCHANGE_RESERVED.intersection(value)
        if reserved:
            raise ValueError(f"may not set {', '.join(sorted(reserved))}: the connector sets those itself")
        return value


@dataclass(frozen=True, slots=True)
class TokenRequest:
    """How the token endpoint is called: the body's encoding and extra parameters of the code exchange and refresh,
    and how a legacy grant (a non-expiring token, no refresh token) is migrated, when the provider has a way."""

    encoding: RequestEncoding = "form"
    exchange_params: Mapping[str, str] = field(default_factory=dict)
    refresh_params: Mapping[str, str] = field(default_factory=dict)
    refresh_tokens: RefreshTokens = "reusable"
    legacy_exchange: LegacyTokenExchange | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "exchange_params", MappingProxyType(dict(self.exchange_params)))
        object.__setattr__(self, "refresh_params", MappingProxyType(dict(self.refresh_params)))


class Revocation(_Table):
    """`[name.revocation]`: how tokens are revoked at `revocation_endpoint` (RFC 7009 by default; GitHub's and
    Dropbox's are not)."""

    method: RevocationMethod = "POST"
    encoding: RequestEncoding = "form"
    auth: RevocationAuth = "client"  # client: as at the token endpoint; basic: HTTP Basic; bearer: the token itself
    token_param: StrictStr | None = "token"  # the body member carrying the token ("" or None: bearer header only)
    token: RevokedToken = "refresh_first"  # which token is sent: the refresh token when there is one, or the access
    hint: StrictBool = True  # send token_type_hint
    # Extra request headers the provider requires on the revocation call (Notion's Notion-Version): plain, public
    # values from the catalog, never credentials (Authorization and Cookie are refused).
    headers: dict[StrictStr, StrictStr] = {}

    @field_validator("headers")
    @classmethod
    def _plain_headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if re.fullmatch(r"[A-Za-z0-9-]{1,64}", name) is None:
                raise ValueError(f"{name!r} is not a header name")
            if name.lower() in {"authorization", "cookie", "proxy-authorization", "content-type", "host"}:
                raise ValueError(f"{name} is set by the connector, not by the catalog")
            if not text or re.fullmatch(r"[\x20-\x7e]{1,200}", text) is None:
                raise ValueError(f"the value of {name} must be printable ASCII (1 to 200 characters)")
        return value

    @field_validator("token_param")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        return value or None


@dataclass(frozen=True, slots=True)
class ApiAuth:
    """How API calls carry the access token: `header: prefix + token`."""

    header: str = "Authorization"
    prefix: str = "Bearer "

    def value(self, token: str) -> str:
        return f"{self.prefix}{token}"


@dataclass(frozen=True, slots=True)
class ConnectionValue:
    """A per-connection value the provider's URLs need (`{name}`), and where it comes from."""

    name: str
    source: ValueSource
    pattern: str  # the value must match it in full
    description: str = ""
    example: str = ""
    pointer: str | None = None  # source = token_response: where in the token response
    parameter: str | None = None  # source = callback: the callback's query parameter
    default: str | None = None  # source = agent: used when the agent gives none
    secret: bool = False  # kept only in the encrypted token set, never shown in grant metadata

    @property
    def required_from_agent(self) -> bool:
        return self.source == "agent" and self.default is None

    def problem(self, value: str) -> str | None:
        """Why `value` is not acceptable for this value, or None."""
        if not value or len(value) > 512 or re.fullmatch(self.pattern, value) is None:
            return f"{self.name} must match {self.pattern}"
        return None

    def origin(self) -> str:
        """Where the value comes from, in words."""
        if self.source == "agent":
            extra = f" (default {self.default})" if self.default is not None else ""
            return f"given by the agent at request_authorization{extra}"
        if self.source == "token_response":
            return f"read from the token response at {self.pointer}"
        return f"read from the callback's {self.parameter} parameter"


@dataclass(frozen=True, slots=True)
class Quirks:
    """Every way a catalog entry departs from plain OAuth 2.0, in one value."""

    token_request: TokenRequest = field(default_factory=TokenRequest)
    token_response: TokenResponseShape = field(default_factory=TokenResponseShape)
    revocation: Revocation = field(default_factory=Revocation)
    api_auth: ApiAuth = field(default_factory=ApiAuth)
    userinfo_method: UserinfoMethod = "GET"
    userinfo_body: str | None = None  # a JSON body for a POST account lookup (a GraphQL query, Dropbox's null)
    scope_parameter: str = "scope"  # the authorization parameter carrying the scopes (Slack user tokens: user_scope)
    account_id_source: AccountSource = "userinfo"
    connection: tuple[ConnectionValue, ...] = ()

    def value(self, name: str) -> ConnectionValue | None:
        return next((value for value in self.connection if value.name == name), None)

    def values_from(self, source: ValueSource) -> tuple[ConnectionValue, ...]:
        return tuple(value for value in self.connection if value.source == source)


PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def fill(template: str, values: Mapping[str, str]) -> str:
    """`template` with each `{name}` in `values` replaced (others are left as they are)."""
    return PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def placeholders(template: str | None) -> set[str]:
    return set(PLACEHOLDER.findall(template or ""))
