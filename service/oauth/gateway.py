"""`ProviderGateway`: the one object the rest of the connector uses to talk to providers.

It resolves catalog entries into `ResolvedProvider`s (discovery, cached), builds authorization requests, redeems
codes (token endpoint, ID token, account), refreshes and revokes. It holds the HTTP client for provider metadata
and the JWKS cache, and closes them on shutdown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime

import httpx

from service.core.ports import AuthorizationRequest, Authorized, Provider
from service.core.records import TokenSet
from service.metrics import Metrics, ProviderEndpoint
from service.providers import ProviderCatalog, ProviderEntry

from . import token
from .authorize import authorization_url, issuer_acceptable, new_flow_secrets
from .discovery import discover
from .id_token import JwksCache, validate_id_token
from .resolved import ResolvedProvider
from .revocation import revoke
from .userinfo import fetch_account


class ProviderGateway:
    def __init__(
        self, catalog: ProviderCatalog, *, http: httpx.AsyncClient | None = None, metrics: Metrics | None = None
    ) -> None:
        self.catalog = catalog
        self.http = http or httpx.AsyncClient(timeout=15.0)
        self.metrics = metrics or Metrics(entry.name for entry in catalog.entries())
        self.jwks = JwksCache()
        self._resolved: dict[str, ResolvedProvider] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def aclose(self) -> None:
        await self.http.aclose()

    # -- the catalog -----------------------------------------------------------------------------------
    def entry(self, name: str) -> ProviderEntry:
        """The catalog entry (UnknownProvider when there is none)."""
        return self.catalog.get(name)

    def require_configured(self, name: str) -> ProviderEntry:
        """The entry if it can be used (ProviderNotConfigured or UnknownProvider otherwise)."""
        return self.catalog.require_configured(name)

    def display_name(self, name: str) -> str:
        resolved = self._resolved.get(name)
        if resolved is not None:
            return resolved.display_name
        return self.catalog.get(name).display_name if name in self.catalog else name

    async def resolve(self, name: str) -> ResolvedProvider:
        """The configured entry with every endpoint known: discovery entries are fetched once, then cached."""
        entry = self.catalog.require_configured(name)
        if entry.discovery_url is None:
            return ResolvedProvider.from_entry(entry)
        cached = self._resolved.get(name)
        if cached is not None:
            return cached
        async with self._locks.setdefault(name, asyncio.Lock()):
            cached = self._resolved.get(name)
            if cached is None:
                with self.metrics.provider_call(name, ProviderEndpoint.DISCOVERY):
                    cached = await discover(entry, entry.discovery_url, self.http)
                self._resolved[name] = cached
        return cached

    # -- the authorization code flow -------------------------------------------------------------------
    def authorization_request(
        self, provider: Provider, *, redirect_uri: str, scopes: Sequence[str]
    ) -> AuthorizationRequest:
        provider = _resolved(provider)
        flow = new_flow_secrets(provider)
        url = authorization_url(provider, redirect_uri=redirect_uri, scopes=scopes, flow=flow)
        return AuthorizationRequest(url, flow.state, flow.code_verifier, flow.nonce, provider.issuer)

    def issuer_acceptable(self, provider: Provider, expected: str | None, received: str | None) -> bool:
        return issuer_acceptable(_resolved(provider), expected, received)

    async def redeem(
        self,
        provider: Provider,
        *,
        redirect_uri: str,
        code: str,
        code_verifier: str | None,
        expected_issuer: str | None,
        nonce: str | None,
        now: datetime,
    ) -> Authorized:
        """Exchange the code; for OpenID providers check the ID token in full; learn the provider account."""
        provider = _resolved(provider)
        with self.metrics.provider_call(provider.name, ProviderEndpoint.TOKEN):
            tokens = await token.exchange_code(
                provider, redirect_uri=redirect_uri, code=code, code_verifier=code_verifier
            )
        id_claims = None
        if provider.oidc:
            # Checked before anything is stored: the account is the ID token's `sub`, signed by the issuer
            # this very request expected, for our client, with the nonce this browser's request carried.
            id_claims = await validate_id_token(
                provider,
                tokens.id_token,
                expected_issuer=expected_issuer,
                nonce=nonce,
                jwks=self.jwks,
                http=self.http,
                now=now.timestamp(),
            )
        if provider.userinfo_endpoint is None:  # the account is the ID token's `sub`: no call
            account_id, _profile = await fetch_account(provider, tokens, id_claims)
        else:
            with self.metrics.provider_call(provider.name, ProviderEndpoint.USERINFO):
                account_id, _profile = await fetch_account(provider, tokens, id_claims)
        return Authorized(tokens, account_id)

    # -- using a grant ---------------------------------------------------------------------------------
    async def refresh(self, provider: ResolvedProvider, tokens: TokenSet) -> TokenSet:
        with self.metrics.provider_call(provider.name, ProviderEndpoint.REFRESH):
            return await token.refresh(provider, tokens)

    async def revoke(self, provider: ResolvedProvider, tokens: TokenSet) -> bool:
        if provider.revocation_endpoint is None:
            return False
        with self.metrics.provider_call(provider.name, ProviderEndpoint.REVOCATION):
            revoked = await revoke(provider, tokens)
        if not revoked:  # best effort: a refusal is not raised, but it is an error of that endpoint
            self.metrics.provider_errors.labels(self.metrics.provider(provider.name), "revocation").inc()
        return revoked


def _resolved(provider: Provider) -> ResolvedProvider:
    """The core hands back what `resolve` gave it; anything else is a programming error."""
    if not isinstance(provider, ResolvedProvider):
        raise TypeError(f"expected a ResolvedProvider, got {type(provider).__name__}")
    return provider
