"""Discovery (OpenID Connect Discovery 1.0, RFC 8414): a provider's metadata from its well-known document.

The document's issuer must match the URL it was fetched from and the configured issuer; every endpoint must be an
absolute https URL (loopback excepted). Errors name the provider, the URL and the field, never a secret.
"""

from __future__ import annotations

from typing import Any, get_args

import httpx

from service.core.errors import ConnectorError
from service.core.urls import url_problem
from service.providers import ProviderEntry, TokenEndpointAuthMethod

from .issuer import implied_issuer, same_issuer
from .resolved import ResolvedProvider

DISCOVERY_FAILED = "provider_discovery_failed"
DISCOVERY_TIMEOUT = httpx.Timeout(10.0)
_AUTH_METHODS: tuple[TokenEndpointAuthMethod, ...] = get_args(TokenEndpointAuthMethod)


def _discovery_error(entry: ProviderEntry, url: str, problem: str) -> ConnectorError:
    return ConnectorError(f"provider {entry.name!r}: discovery at {url} failed: {problem}", code=DISCOVERY_FAILED)


async def discover(entry: ProviderEntry, url: str, http: httpx.AsyncClient) -> ResolvedProvider:
    """Fetch and check the discovery document at `url`; the entry with every endpoint filled in."""
    try:
        response = await http.get(url, headers={"Accept": "application/json"}, timeout=DISCOVERY_TIMEOUT)
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
        problem = url_problem(value)
        if problem is not None:
            raise _discovery_error(entry, url, f"{key} {problem}")
        return value

    issuer = text("issuer", required=True)
    assert issuer is not None
    implied = implied_issuer(url)
    if implied is not None and not same_issuer(issuer, implied):
        raise _discovery_error(entry, url, f"the document's issuer {issuer} does not match its location ({implied})")
    if entry.issuer is not None and not same_issuer(issuer, entry.issuer):
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
        token_endpoint_auth_method=auth_method,
    )
