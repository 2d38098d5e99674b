"""The token endpoint (RFC 6749 §4.1.3, §6): redeeming an authorization code, and refresh with rotation."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import httpx

from service.core.errors import ProviderError
from service.core.records import TokenSet

from .client import OAuthError, oauth_client, provider_error
from .resolved import ResolvedProvider


def _token_set(raw: Mapping[str, Any], entry: ResolvedProvider) -> TokenSet:
    access_token = raw.get("access_token")
    if not isinstance(access_token, str) or not access_token:
        raise ProviderError(f"provider '{entry.name}' returned no access token", code="provider_bad_response")
    expires_at = raw.get("expires_at")
    if expires_at is None and raw.get("expires_in") is not None:
        expires_at = time.time() + float(raw["expires_in"])
    granted = raw.get("scope")
    scopes: tuple[str, ...] | None = None
    if isinstance(granted, str):
        # Providers differ: GitHub and Slack separate granted scopes with commas, others with spaces.
        scopes = tuple(s for s in granted.replace(",", " ").split() if s)
    return TokenSet(
        access_token=access_token,
        token_type=str(raw.get("token_type") or "Bearer"),
        refresh_token=raw.get("refresh_token"),
        expires_at=float(expires_at) if expires_at is not None else None,
        scopes=scopes,
        id_token=raw.get("id_token"),
    )


async def exchange_code(
    entry: ResolvedProvider, *, redirect_uri: str, code: str, code_verifier: str | None
) -> TokenSet:
    kwargs: dict[str, Any] = {}
    if code_verifier is not None:
        kwargs["code_verifier"] = code_verifier
    async with oauth_client(entry, redirect_uri=redirect_uri) as client:
        try:
            raw = await client.fetch_token(entry.token_endpoint, grant_type="authorization_code", code=code, **kwargs)
        except (OAuthError, httpx.HTTPError, ValueError) as exc:
            raise provider_error(entry, "authorization code exchange", exc) from None
    return _token_set(raw, entry)


async def refresh(entry: ResolvedProvider, token: TokenSet) -> TokenSet:
    if token.refresh_token is None:
        raise ProviderError(f"the {entry.display_name} grant cannot be refreshed", code="not_refreshable")
    async with oauth_client(entry) as client:
        try:
            raw = await client.refresh_token(entry.token_endpoint, refresh_token=token.refresh_token)
        except (OAuthError, httpx.HTTPError, ValueError) as exc:
            raise provider_error(entry, "token refresh", exc) from None
    fresh = _token_set(raw, entry)
    # Providers without rotation keep the old refresh token valid and may omit the scopes.
    return replace(
        fresh,
        refresh_token=fresh.refresh_token or token.refresh_token,
        scopes=fresh.scopes if fresh.scopes is not None else token.scopes,
    )
