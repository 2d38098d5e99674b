"""Using a stored grant: decrypt its tokens, refresh them single-flight, and inject them into provider calls.

Tokens leave this module only inside the Authorization header of a request to the provider's own API host.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from datetime import UTC, datetime

import httpx

from .core.errors import ConnectorError, NotAuthorized, ProviderError
from .core.handles import grant_aad
from .core.records import GrantRecord, TokenSet
from .metrics import Metrics, RefreshResult
from .oauth import ProviderGateway, ResolvedProvider
from .store import Store
from .vault import Vault

log = logging.getLogger("service.tokens")

# Refresh this long before the provider's stated expiry, so a request never leaves with a dying token.
REFRESH_AHEAD_SECONDS = 60.0


def _aad(grant: GrantRecord) -> bytes:
    return grant_aad(grant.identity.issuer, grant.identity.subject, grant.provider, grant.provider_account_id)


class TokenAccess:
    def __init__(
        self,
        store: Store,
        vault: Vault,
        providers: ProviderGateway,
        clock: Callable[[], datetime],
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.vault = vault
        self.providers = providers
        self.now = clock
        self.metrics = metrics or providers.metrics
        self._locks: dict[str, asyncio.Lock] = {}
        # Decrypted token sets by grant id, so a request does not cost a database read and a decryption.
        # A set is used from here only while it is not near expiry; a 401 (`stale`) always re-reads the
        # database, where another process may have stored a refreshed set.
        self._cache: dict[str, TokenSet] = {}

    def forget(self, grant_id: str) -> None:
        self._cache.pop(grant_id, None)

    def decrypt(self, grant: GrantRecord) -> TokenSet:
        return TokenSet.from_json(self.vault.decrypt_json(grant.token_key_id, grant.token_ciphertext, aad=_aad(grant)))

    async def access_token(self, grant_id: str, provider: ResolvedProvider, *, stale: str | None = None) -> str:
        """A usable access token; refreshes when near expiry, or when the caller saw `stale` rejected."""
        cached = self._cache.get(grant_id)
        if stale is None and cached is not None and not cached.expires_within(REFRESH_AHEAD_SECONDS):
            return cached.access_token
        lock = self._locks.setdefault(grant_id, asyncio.Lock())
        async with lock:
            grant = await self.store.grants.get(grant_id)
            if grant is None:
                self.forget(grant_id)
                raise NotAuthorized("the grant was disconnected")
            tokens = self.decrypt(grant)
            self._cache[grant_id] = tokens
            must_refresh = (stale is not None and tokens.access_token == stale) or tokens.expires_within(
                REFRESH_AHEAD_SECONDS
            )
            if not must_refresh:
                return tokens.access_token
            if tokens.refresh_token is None:
                if stale is not None:
                    raise NotAuthorized(f"the {provider.display_name} token was rejected and cannot be refreshed")
                return tokens.access_token
            fresh = await self._refresh(grant, provider, tokens)
            self._cache[grant_id] = fresh
            return fresh.access_token

    async def _refresh(self, grant: GrantRecord, provider: ResolvedProvider, tokens: TokenSet) -> TokenSet:
        try:
            fresh = await self.providers.refresh(provider, tokens)
        except ProviderError as exc:
            self.metrics.refresh(grant.provider, RefreshResult.FAILED)
            await self.store.audit.record(
                "refresh_failed",
                identity=grant.identity,
                provider=grant.provider,
                detail={"grant_id": grant.id, "reason": exc.code},
                now=self.now(),
            )
            raise NotAuthorized(f"the {provider.display_name} grant needs to be authorized again ({exc})") from None
        key_id, blob = self.vault.encrypt_json(fresh.to_json(), aad=_aad(grant))
        expires = datetime.fromtimestamp(fresh.expires_at, UTC) if fresh.expires_at is not None else None
        # The provider may have rotated the refresh token: store the new set before anyone can use the old one.
        await self.store.grants.update_tokens(
            grant.id,
            token_key_id=key_id,
            token_ciphertext=blob,
            token_expires_at=expires,
            scopes=fresh.scopes if fresh.scopes is not None else grant.scopes,
            now=self.now(),
        )
        self.metrics.refresh(grant.provider, RefreshResult.REFRESHED)
        await self.store.audit.record(
            "refreshed",
            identity=grant.identity,
            provider=grant.provider,
            detail={"grant_id": grant.id},
            now=self.now(),
        )
        return fresh


class GrantAuth(httpx.Auth):
    """httpx auth that adds the grant's bearer token, only for the provider's API host, and retries once on 401."""

    def __init__(self, tokens: TokenAccess, grant_id: str, provider: ResolvedProvider) -> None:
        self._tokens = tokens
        self._grant_id = grant_id
        self._provider = provider
        if not provider.api_base_url:
            raise ConnectorError(f"provider '{provider.name}' has no api_base_url", code="provider_misconfigured")
        self._origin = httpx.URL(provider.api_base_url)

    def _check_destination(self, url: httpx.URL) -> None:
        if (url.scheme, url.host, url.port) != (self._origin.scheme, self._origin.host, self._origin.port):
            raise ConnectorError(
                f"refusing to send {self._provider.display_name} credentials to {url.scheme}://{url.host}: "
                f"only {self._origin.scheme}://{self._origin.host} receives them",
                code="credential_host_not_allowed",
            )

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        self._check_destination(request.url)
        token = await self._tokens.access_token(self._grant_id, self._provider)
        request.headers["Authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code == 401:
            await response.aread()
            try:
                fresh = await self._tokens.access_token(self._grant_id, self._provider, stale=token)
            except NotAuthorized:
                return
            if fresh != token:
                request.headers["Authorization"] = f"Bearer {fresh}"
                yield request
