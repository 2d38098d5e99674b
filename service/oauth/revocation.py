"""Token revocation (RFC 7009): best effort, the refresh token first."""

from __future__ import annotations

import logging

import httpx

from service.core.records import TokenSet

from .client import OAuthError, oauth_client
from .resolved import ResolvedProvider

log = logging.getLogger("service.oauth")


async def revoke(entry: ResolvedProvider, token: TokenSet) -> bool:
    """Best-effort revocation (RFC 7009). False when the provider has no endpoint or refused."""
    if entry.revocation_endpoint is None:
        return False
    async with oauth_client(entry) as client:
        try:
            target = token.refresh_token or token.access_token
            hint = "refresh_token" if token.refresh_token else "access_token"
            response = await client.revoke_token(entry.revocation_endpoint, token=target, token_type_hint=hint)
        except (OAuthError, httpx.HTTPError) as exc:
            log.warning("revocation at %s failed: %s", entry.name, type(exc).__name__)
            return False
    return bool(response.status_code < 400)
