"""Client authentication at the token and revocation endpoints (RFC 6749 §2.3, OpenID Connect Core §9).

The one place that decides how the connector proves who it is to a provider, and that writes it onto a request:
- `client_secret_basic`: HTTP Basic with the client id and secret each `application/x-www-form-urlencoded`
  first (RFC 6749 §2.3.1, Appendix B), so that a secret with `+`, `/`, `=` or `:` survives the provider's
  form-decoding;
- `client_secret_post`: `client_id` and `client_secret` in the form body;
- `private_key_jwt`: a JWT signed with the connector's own key (RFC 7523 §2.2, `client_keys.py`), `client_id`,
  `client_assertion_type` and `client_assertion` in the form body; the key never leaves the connector, and the
  provider verifies with the public JWKS the connector serves (or that the operator pasted);
- `none`: a public client, `client_id` in the form body and PKCE as the only proof.

The method is the configured one, else chosen from the discovery document's
`token_endpoint_auth_methods_supported`; `AuthChoice.reason` says which rule decided, for `providers check`.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import get_args
from urllib.parse import quote_plus

from pydantic import SecretStr

from service.providers import TokenEndpointAuthMethod

from .client_keys import ASSERTION_TYPE

AUTH_METHODS: tuple[TokenEndpointAuthMethod, ...] = get_args(TokenEndpointAuthMethod)
# Without a discovery document (or without the field) RFC 6749 and OpenID Connect Discovery both make Basic the
# default a provider supports; a catalog entry that names no method keeps `client_secret_post`, which is what the
# shipped static providers expect.
STATIC_DEFAULT: TokenEndpointAuthMethod = "client_secret_post"


@dataclass(frozen=True, slots=True)
class AuthChoice:
    method: TokenEndpointAuthMethod
    reason: str  # a sentence for `providers check`: why this method


def choose_auth_method(
    configured: TokenEndpointAuthMethod | None,
    supported: Sequence[str] | None,
    *,
    has_secret: bool,
    discovered: bool,
) -> AuthChoice:
    """The method to use: the configured one, else the provider's preference among those we can use."""
    if configured is not None:
        return AuthChoice(configured, "configured (token_endpoint_auth_method)")
    if not has_secret:
        return AuthChoice("none", "no client secret is set: a public client, PKCE only")
    if supported is None:
        if discovered:
            return AuthChoice(
                "client_secret_basic",
                "the discovery document lists no token_endpoint_auth_methods_supported, whose default is "
                "client_secret_basic",
            )
        return AuthChoice(STATIC_DEFAULT, "the catalog's default for providers without a discovery document")
    for method in ("client_secret_basic", "client_secret_post"):
        if method in supported:
            return AuthChoice(method, f"the first of the methods we speak that the provider lists ({method})")
    if "private_key_jwt" in supported:
        return AuthChoice(
            "private_key_jwt", "the provider lists no client_secret method, and private_key_jwt (our key in the vault)"
        )
    raise ValueError(
        "the provider lists none of client_secret_basic, client_secret_post, private_key_jwt in "
        "token_endpoint_auth_methods_supported"
    )


def _form_encoded(value: str) -> str:
    return quote_plus(value, safe="")


def basic_credentials(client_id: str, client_secret: str) -> str:
    """The `Authorization` header value of RFC 6749 §2.3.1: form-encode id and secret, join with ':', base64."""
    raw = f"{_form_encoded(client_id)}:{_form_encoded(client_secret)}"
    return "Basic " + base64.b64encode(raw.encode()).decode("ascii")


def authenticate(
    method: TokenEndpointAuthMethod,
    client_id: str,
    client_secret: SecretStr | None,
    form: Mapping[str, str],
    *,
    assertion: Callable[[], str] | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """(headers, form) for a token, revocation or pushed authorization request made by this client; `assertion`
    makes a fresh `private_key_jwt` assertion for it."""
    data = dict(form)
    headers: dict[str, str] = {}
    if method == "none":
        data["client_id"] = client_id
        return headers, data
    if method == "private_key_jwt":
        if assertion is None:
            raise ValueError("private_key_jwt needs the connector's signing key (the vault)")
        data.update(client_id=client_id, client_assertion_type=ASSERTION_TYPE, client_assertion=assertion())
        return headers, data
    if client_secret is None:
        raise ValueError(f"{method} needs a client secret")
    secret = client_secret.get_secret_value()
    if method == "client_secret_basic":
        headers["Authorization"] = basic_credentials(client_id, secret)
    else:
        data["client_id"] = client_id
        data["client_secret"] = secret
    return headers, data
