"""The authorization request: PKCE S256 (RFC 7636), single-use `state`, OpenID Connect `nonce`, and RFC 9207 `iss`."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from .client import oauth_client
from .issuer import issuer_matches
from .resolved import ResolvedProvider


@dataclass(frozen=True, slots=True)
class FlowSecrets:
    """Per-transaction values: `state` goes to the provider and back, the verifier never leaves the server."""

    state: str
    code_verifier: str | None
    nonce: str | None

    def __repr__(self) -> str:
        return "FlowSecrets(<redacted>)"


def new_flow_secrets(entry: ResolvedProvider) -> FlowSecrets:
    return FlowSecrets(
        state=secrets.token_urlsafe(32),
        code_verifier=secrets.token_urlsafe(64) if entry.pkce else None,  # 86 chars, within RFC 7636's 43..128
        nonce=secrets.token_urlsafe(24) if entry.oidc else None,
    )


def authorization_scopes(entry: ResolvedProvider, scopes: Sequence[str]) -> str:
    """The `scope` parameter sent: an OpenID Connect provider is always asked for `openid` (so an ID token)."""
    return entry.join_scopes(("openid", *scopes) if entry.oidc else scopes)


def authorization_url(entry: ResolvedProvider, *, redirect_uri: str, scopes: Sequence[str], flow: FlowSecrets) -> str:
    extra: dict[str, str] = dict(entry.extra_authorize_params)
    if flow.nonce is not None:
        extra["nonce"] = flow.nonce
    client = oauth_client(entry, redirect_uri=redirect_uri)
    url, _ = client.create_authorization_url(
        entry.authorization_endpoint,
        state=flow.state,
        code_verifier=flow.code_verifier,
        scope=authorization_scopes(entry, scopes),
        **extra,
    )
    return str(url)


def issuer_acceptable(entry: ResolvedProvider, expected: str | None, received: str | None) -> bool:
    """RFC 9207: an authorization response's `iss` (None: absent) must be the expected issuer when the provider
    sends one or promises to; without an expected issuer there is nothing to compare."""
    if expected is None:
        return True
    if received is None:
        return not entry.authorization_response_iss_parameter_supported
    return issuer_matches(expected, received)
