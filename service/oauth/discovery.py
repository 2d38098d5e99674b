"""Discovery (OpenID Connect Discovery 1.0, RFC 8414): a provider's metadata from its well-known document.

The document's issuer must match the URL it was fetched from and the configured issuer; every endpoint must be an
absolute https URL (loopback excepted). Errors name the provider, the URL and the field, never a secret.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, overload

import httpx

from service.core.errors import DiscoveryError
from service.core.urls import url_problem
from service.providers import ProviderEntry

from .client_auth import AuthChoice, choose_auth_method
from .issuer import implied_issuer, same_issuer
from .resolved import ResolvedProvider

DISCOVERY_FAILED = DiscoveryError.code
DISCOVERY_TIMEOUT = httpx.Timeout(10.0)
# The endpoint members read, in this order (RFC 8414 section 2: the first two are required for the code flow).
_ENDPOINTS = (
    "authorization_endpoint",
    "token_endpoint",
    "userinfo_endpoint",
    "revocation_endpoint",
    "jwks_uri",
    "pushed_authorization_request_endpoint",
)
_REQUIRED_ENDPOINTS = frozenset(_ENDPOINTS[:2])


async def discover(entry: ProviderEntry, url: str, http: httpx.AsyncClient) -> ResolvedProvider:
    """Fetch and check the discovery document at `url`; the entry with every endpoint filled in."""
    document = _Document(entry, url, await _fetch(entry, url, http))
    issuer = _issuer(document)
    endpoints = {key: document.url_member(key, required=key in _REQUIRED_ENDPOINTS) for key in _ENDPOINTS}
    iss_supported = _iss_parameter_supported(document)
    if entry.oidc and not (entry.jwks_uri or endpoints["jwks_uri"]):
        raise document.error("has no jwks_uri, needed to check ID tokens", "jwks_uri")
    methods = document.text_list("token_endpoint_auth_methods_supported")
    auth = _auth_method(document, methods)
    algorithms = document.text_list("id_token_signing_alg_values_supported")
    assertion_algs = document.text_list("token_endpoint_auth_signing_alg_values_supported")
    dpop_algs = document.text_list("dpop_signing_alg_values_supported")
    if entry.fapi2:
        _fapi2_capable(document, methods, dpop_algs, iss_supported, endpoints["pushed_authorization_request_endpoint"])
    # Endpoints written in the catalog win over discovered ones (operators can pin them); the issuer is the
    # document's exact string, as ID tokens and RFC 9207 `iss` carry it.
    return ResolvedProvider(
        entry=entry,
        issuer=issuer,
        authorization_endpoint=_required(entry.authorization_endpoint or endpoints["authorization_endpoint"]),
        token_endpoint=_required(entry.token_endpoint or endpoints["token_endpoint"]),
        userinfo_endpoint=entry.userinfo_endpoint or endpoints["userinfo_endpoint"],
        revocation_endpoint=entry.revocation_endpoint or endpoints["revocation_endpoint"],
        jwks_uri=entry.jwks_uri or endpoints["jwks_uri"],
        par_endpoint=entry.pushed_authorization_request_endpoint or endpoints["pushed_authorization_request_endpoint"],
        par_required=_boolean(document, "require_pushed_authorization_requests"),
        authorization_response_iss_parameter_supported=iss_supported,
        token_endpoint_auth_method=auth.method,
        auth_method_reason=auth.reason,
        id_token_algorithms=tuple(algorithms) if algorithms is not None else None,
        discovered=True,
        extra={
            "token_endpoint_auth_methods_supported": tuple(methods) if methods is not None else None,
            "token_endpoint_auth_signing_alg_values_supported": (
                tuple(assertion_algs) if assertion_algs is not None else None
            ),
            "dpop_signing_alg_values_supported": tuple(dpop_algs) if dpop_algs is not None else None,
            "prompt_values_supported": tuple(document.text_list("prompt_values_supported") or ()),
        },
    )


def _required(value: str | None) -> str:
    assert value is not None  # a required member: `url_member` refused a document without it
    return value


async def _fetch(entry: ProviderEntry, url: str, http: httpx.AsyncClient) -> dict[str, Any]:
    """RFC 8414 section 3.2: "A successful response MUST use the 200 OK HTTP status code and return a JSON object
    using the "application/json" content type that contains a set of claims as its members"."""
    try:
        response = await http.get(url, headers={"Accept": "application/json"}, timeout=DISCOVERY_TIMEOUT)
    except httpx.HTTPError as exc:
        raise DiscoveryError(entry, url, f"could not be fetched ({type(exc).__name__})") from None
    if response.status_code != 200:
        raise DiscoveryError(entry, url, f"answered HTTP status {response.status_code}")
    try:
        document: Any = response.json()
    except ValueError:
        raise DiscoveryError(entry, url, "is not JSON") from None
    if not isinstance(document, dict):
        raise DiscoveryError(entry, url, "is not a JSON object")
    return document


@dataclass(frozen=True, slots=True)
class _Document:
    """A fetched discovery document, read member by member; each refusal names the member."""

    entry: ProviderEntry
    url: str
    members: dict[str, Any]

    def error(self, problem: str, member: str | None = None) -> DiscoveryError:
        return DiscoveryError(self.entry, self.url, problem, member)

    @overload
    def url_member(self, key: str) -> str: ...
    @overload
    def url_member(self, key: str, *, required: bool) -> str | None: ...
    def url_member(self, key: str, *, required: bool = True) -> str | None:
        """A URL member: absolute, and https unless its host is loopback (`core.urls`)."""
        value = self.members.get(key)
        if value is None or value == "":
            if required:
                raise self.error(f"has no {key}", key)
            return None
        if not isinstance(value, str):
            raise self.error(f"has a {key} that is not a string", key)
        problem = url_problem(value)
        if problem is not None:
            raise self.error(f"has a {key} that {problem}", key)
        return value

    def text_list(self, key: str) -> list[str] | None:
        value = self.members.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self.error(f"has a {key} that is not a list of strings", key)
        return value


def _issuer(document: _Document) -> str:
    """OpenID Connect Discovery 4.3: "The issuer value returned MUST be identical to the Issuer URL that was used as
    the prefix to /.well-known/openid-configuration to retrieve the configuration information." (RFC 8414 section
    3.3 says the same of its well-known URI.) And it must be the issuer the catalog names, when it names one."""
    issuer = document.url_member("issuer")
    implied = implied_issuer(document.url)
    if implied is not None and not same_issuer(issuer, implied):
        raise document.error(f"names the issuer {issuer}, which does not match its location", "issuer")
    configured = document.entry.issuer
    if configured is not None and not same_issuer(issuer, configured):
        raise document.error(f"names the issuer {issuer}, which is not the configured one", "issuer")
    return issuer


def _iss_parameter_supported(document: _Document) -> bool:
    """RFC 9207 section 3: "authorization_response_iss_parameter_supported: Boolean parameter indicating whether the
    authorization server provides the iss parameter in the authorization response" (absent: false)."""
    key = "authorization_response_iss_parameter_supported"
    value = document.members.get(key, False)
    if not isinstance(value, bool):
        raise document.error(f"has an {key} that is not a boolean", key)
    return value


def _fapi2_capable(
    document: _Document,
    methods: list[str] | None,
    dpop_algs: list[str] | None,
    iss_supported: bool,
    par_endpoint: str | None,
) -> None:
    """A FAPI 2.0 entry (`fapi2 = true`) runs only against a provider that can do every part of the profile: the
    first it cannot is refused, naming the metadata member that says so."""
    if par_endpoint is None and document.entry.pushed_authorization_request_endpoint is None:
        raise document.error(
            "has no pushed_authorization_request_endpoint, and the FAPI 2.0 profile (fapi2) needs PAR",
            "pushed_authorization_request_endpoint",
        )
    if methods is not None and "private_key_jwt" not in methods:
        raise document.error(
            "does not list private_key_jwt, and the FAPI 2.0 profile (fapi2) needs it",
            "token_endpoint_auth_methods_supported",
        )
    if dpop_algs is None or "ES256" not in dpop_algs:
        raise document.error(
            "does not list ES256, and the FAPI 2.0 profile (fapi2) needs DPoP", "dpop_signing_alg_values_supported"
        )
    if not iss_supported:
        raise document.error(
            "does not promise the iss parameter (RFC 9207), and the FAPI 2.0 profile (fapi2) needs it",
            "authorization_response_iss_parameter_supported",
        )
    challenge = document.text_list("code_challenge_methods_supported")
    if challenge is not None and "S256" not in challenge:
        raise document.error(
            "does not list S256, and the FAPI 2.0 profile (fapi2) needs PKCE S256", "code_challenge_methods_supported"
        )


def _boolean(document: _Document, key: str) -> bool:
    """A boolean metadata member (absent: false)."""
    value = document.members.get(key, False)
    if not isinstance(value, bool):
        raise document.error(f"has a {key} that is not a boolean", key)
    return value


def _auth_method(document: _Document, methods: list[str] | None) -> AuthChoice:
    """How the connector authenticates at the token endpoint: the configured method, or the best the document's
    token_endpoint_auth_methods_supported offers (RFC 8414 section 2; absent: client_secret_basic)."""
    entry = document.entry
    try:
        return choose_auth_method(
            entry.token_endpoint_auth_method, methods, has_secret=entry.has_secret, discovered=True
        )
    except ValueError as exc:
        raise document.error(f"says {exc}", "token_endpoint_auth_methods_supported") from None
