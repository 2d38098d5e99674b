"""Token revocation (RFC 7009): best effort, the refresh token first."""

from __future__ import annotations

import logging

import httpx

from service.core.errors import ProviderError
from service.core.records import TokenSet

from .endpoint import post_form
from .resolved import ResolvedProvider

log = logging.getLogger("service.oauth")


async def revoke(entry: ResolvedProvider, http: httpx.AsyncClient, token: TokenSet) -> bool:
    """Best-effort revocation (RFC 7009). False when the provider has no endpoint or refused."""
    if entry.revocation_endpoint is None:
        return False
    target = token.refresh_token or token.access_token
    hint = "refresh_token" if token.refresh_token else "access_token"
    try:
        await post_form(
            entry, http, entry.revocation_endpoint, {"token": target, "token_type_hint": hint}, "revocation"
        )
    except ProviderError as exc:
        log.warning("revocation at %s failed: %s", entry.name, exc)
        return False
    return True
