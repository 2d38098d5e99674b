"""The token endpoint (RFC 6749 §4.1.3, §6): redeeming an authorization code, and refresh with rotation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import httpx

from service.core.errors import ProviderError
from service.core.records import OFFLINE_ACCESS, TokenSet

from .endpoint import post_form
from .resolved import ResolvedProvider

OPENID = "openid"


def granted_scopes(raw: object) -> tuple[str, ...] | None:
    """The `scope` member of a token response (None when absent: then it is what was asked, RFC 6749 §5.1)."""
    if not isinstance(raw, str):
        return None
    # Providers differ: GitHub and Slack separate granted scopes with commas, others with spaces.
    return tuple(s for s in raw.replace(",", " ").split() if s)


def with_granted_names(tokens: TokenSet, entry: ResolvedProvider) -> TokenSet:
    """The token set with its scopes named as they were asked, so that a grant covers what was granted:
    a scope whose alias the provider answered (`scope_aliases`) is listed by its asked name too; for an OpenID
    provider `openid` is granted (its ID token was checked) and `offline_access` is granted exactly when a refresh
    token came (some providers leave both out of `scope`, and a dropped `offline_access` shows only this way)."""
    if tokens.scopes is None:
        return tokens
    scopes = list(tokens.scopes)
    scopes += [asked for asked, answered in entry.scope_aliases.items() if answered in scopes and asked not in scopes]
    if entry.oidc:
        scopes = [scope for scope in scopes if scope != OFFLINE_ACCESS]
        scopes += [OPENID] if OPENID not in scopes else []
        scopes += [OFFLINE_ACCESS] if tokens.refresh_token is not None else []
    return replace(tokens, scopes=tuple(scopes))


def token_set(raw: Any, entry: ResolvedProvider, *, now: float) -> TokenSet:
    """A token response as a `TokenSet`; `now` (epoch seconds) dates it."""
    if not isinstance(raw, Mapping):
        raise ProviderError(f"{entry.display_name} answered the token request unreadably", code="provider_bad_response")
    access_token = raw.get("access_token")
    if not isinstance(access_token, str) or not access_token:
        raise ProviderError(f"{entry.display_name} returned no access token", code="provider_bad_response")
    expires_at: float | None = None
    expires_in = raw.get("expires_in")
    if expires_in is not None:
        try:
            expires_at = now + float(expires_in)
        except (TypeError, ValueError):
            raise ProviderError(
                f"{entry.display_name} returned an unreadable expires_in", code="provider_bad_response"
            ) from None
    refresh_token = raw.get("refresh_token")
    id_token = raw.get("id_token")
    return TokenSet(
        access_token=access_token,
        token_type=str(raw.get("token_type") or "Bearer"),
        refresh_token=refresh_token if isinstance(refresh_token, str) and refresh_token else None,
        expires_at=expires_at,
        scopes=granted_scopes(raw.get("scope")),
        id_token=id_token if isinstance(id_token, str) and id_token else None,
        issued_at=now,
    )


async def exchange_code(
    entry: ResolvedProvider,
    http: httpx.AsyncClient,
    *,
    redirect_uri: str,
    code: str,
    code_verifier: str | None,
    now: float,
) -> TokenSet:
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri}
    if code_verifier is not None:
        form["code_verifier"] = code_verifier
    _, body = await post_form(entry, http, entry.token_endpoint, form, "authorization code exchange")
    return with_granted_names(token_set(body, entry, now=now), entry)


async def refresh(entry: ResolvedProvider, http: httpx.AsyncClient, token: TokenSet, *, now: float) -> TokenSet:
    if token.refresh_token is None:
        raise ProviderError(f"the {entry.display_name} grant cannot be refreshed", code="not_refreshable")
    form = {"grant_type": "refresh_token", "refresh_token": token.refresh_token}
    _, body = await post_form(entry, http, entry.token_endpoint, form, "token refresh")
    fresh = token_set(body, entry, now=now)
    # Providers without rotation keep the old refresh token valid and may omit the scopes.
    fresh = replace(fresh, refresh_token=fresh.refresh_token or token.refresh_token)
    if fresh.scopes is None:
        return replace(fresh, scopes=token.scopes)
    return with_granted_names(fresh, entry)
