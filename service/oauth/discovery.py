"""Discovery (OpenID Connect Discovery 1.0, RFC 8414): a provider's metadata from its well-known document.

The document's issuer must match the URL it was fetched from and the configured issuer; every endpoint must be an
absolute https URL (loopback excepted). Errors name the provider, the URL and the field, never a secret.
"""

from __future__ import annotations

from typing import Any

import httpx

from service.core.errors import DiscoveryError
from service.core.urls import url_problem
from service.providers import ProviderEntry

from .client_auth import choose_auth_method
from .issuer import implied_issuer, same_issuer
from .resolved import ResolvedProvider

DISCOVERY_FAILED = DiscoveryError.code
DISCOVERY_TIMEOUT = httpx.Timeout(10.0)


async def discover(entry: ProviderEntry, url: str, http: httpx.AsyncClient) -> ResolvedProvider:
    """Fetch and check the discovery document at `url`; the entry with every endpoint filled in."""
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

    def text(key: str, *, required: bool) -> str | None:
        value = document.get(key)
        if value is None or value == "":
            if required:
                raise DiscoveryError(entry, url, f"has no {key}", key)
            return None
        if not isinstance(value, str):
            raise DiscoveryError(entry, url, f"has a {key} that is not a string", key)
        problem = url_problem(value)
        if problem is not None:
            raise DiscoveryError(entry, url, f"has a {key} that {problem}", key)
        return value

    def text_list(key: str) -> list[str] | None:
        value = document.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise DiscoveryError(entry, url, f"has a {key} that is not a list of strings", key)
        return value

    issuer = text("issuer", required=True)
    assert issuer is not None
    implied = implied_issuer(url)
    if implied is not None and not same_issuer(issuer, implied):
        raise DiscoveryError(entry, url, f"names the issuer {issuer}, which does not match its location", "issuer")
    if entry.issuer is not None and not same_issuer(issuer, entry.issuer):
        raise DiscoveryError(entry, url, f"names the issuer {issuer}, which is not the configured one", "issuer")

    authorization_endpoint = text("authorization_endpoint", required=True)
    token_endpoint = text("token_endpoint", required=True)
    userinfo_endpoint = text("userinfo_endpoint", required=False)
    revocation_endpoint = text("revocation_endpoint", required=False)
    jwks_uri = text("jwks_uri", required=False)

    iss_supported = document.get("authorization_response_iss_parameter_supported", False)
    if not isinstance(iss_supported, bool):
        raise DiscoveryError(
            entry,
            url,
            "has an authorization_response_iss_parameter_supported that is not a boolean",
            "authorization_response_iss_parameter_supported",
        )
    if entry.oidc and not (entry.jwks_uri or jwks_uri):
        raise DiscoveryError(entry, url, "has no jwks_uri, needed to check ID tokens", "jwks_uri")

    methods = text_list("token_endpoint_auth_methods_supported")
    try:
        auth = choose_auth_method(
            entry.token_endpoint_auth_method, methods, has_secret=entry.has_secret, discovered=True
        )
    except ValueError as exc:
        raise DiscoveryError(entry, url, f"says {exc}", "token_endpoint_auth_methods_supported") from None
    algorithms = text_list("id_token_signing_alg_values_supported")

    # Endpoints written in the catalog win over discovered ones (operators can pin them); the issuer is the
    # document's exact string, as ID tokens and RFC 9207 `iss` carry it.
    assert authorization_endpoint is not None and token_endpoint is not None
    return ResolvedProvider(
        entry=entry,
        issuer=issuer,
        authorization_endpoint=entry.authorization_endpoint or authorization_endpoint,
        token_endpoint=entry.token_endpoint or token_endpoint,
        userinfo_endpoint=entry.userinfo_endpoint or userinfo_endpoint,
        revocation_endpoint=entry.revocation_endpoint or revocation_endpoint,
        jwks_uri=entry.jwks_uri or jwks_uri,
        authorization_response_iss_parameter_supported=iss_supported,
        token_endpoint_auth_method=auth.method,
        auth_method_reason=auth.reason,
        id_token_algorithms=tuple(algorithms) if algorithms is not None else None,
        discovered=True,
        extra={"token_endpoint_auth_methods_supported": tuple(methods) if methods is not None else None},
    )
