"""`ProviderGateway`: the one object the rest of the connector uses to talk to providers.

It resolves catalog entries into `ResolvedProvider`s (discovery cached for `discovery_ttl` seconds and fetched
again after a failure), builds authorization requests, redeems codes (token endpoint, ID token, account),
refreshes (checking a refresh's ID token) and revokes. It owns the pooled HTTP clients (`ProviderHttp`, one pool
per provider) and the JWKS cache, and closes them on shutdown. The `oidc` identity verifier resolves its own
entry through it too (`resolve_entry`), so there is one discovery, one JWKS cache and one ID-token check.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeVar

import httpx

from service.core.accounts import AccountAsk
from service.core.credentials import CredentialForm, CredentialVerdict
from service.core.errors import DiscoveryError, EndpointError, ProviderError
from service.core.ports import AuthorizationRequest, Authorized, Provider
from service.core.records import TokenSet
from service.metrics import Metrics, ProviderEndpoint
from service.providers import ProviderCatalog, ProviderEntry

from . import credentials, token
from .authorize import authorization_params, authorization_url, issuer_acceptable, new_flow_secrets
from .client_keys import ClientKeys
from .discovery import discover
from .dpop import Dpop, DpopKey, DpopNonces
from .http import ProviderHttp
from .id_token import IdTokenExpectations, JwksCache, unverified_claims, validate_id_token
from .par import pushed_authorization_url
from .resolved import ResolvedProvider, callback_values
from .revocation import revoke
from .userinfo import account_label, fetch_account

log = logging.getLogger("service.oauth")

DISCOVERY_TTL = 3600.0
# After a failed re-read of a document we already have, the old one serves this long before the next try.
RETRY_AFTER_FAILURE = 60.0

T = TypeVar("T")


@dataclass(slots=True)
class _Discovered:
    provider: ResolvedProvider
    fresh_until: float  # monotonic seconds


class ProviderGateway:
    def __init__(
        self,
        catalog: ProviderCatalog,
        *,
        http: ProviderHttp | None = None,
        discovery_ttl: float = DISCOVERY_TTL,
        monotonic: Callable[[], float] = time.monotonic,
        metrics: Metrics | None = None,
        client_keys: ClientKeys | None = None,
    ) -> None:
        self.catalog = catalog
        self.client_keys = client_keys
        self.dpop_nonces = DpopNonces()  # the DPoP-Nonce each provider origin handed out last
        self.http = http or ProviderHttp()
        self.metrics = metrics or Metrics(entry.name for entry in catalog.entries())
        self.discovery_ttl = discovery_ttl
        self.jwks = JwksCache(ttl=discovery_ttl or DISCOVERY_TTL)
        self._monotonic = monotonic
        self._discovered: dict[str, _Discovered] = {}
        self._static: dict[str, ResolvedProvider] = {}
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
        """What people are shown for a provider: its display name, else its issuer's (or sign-in) host."""
        discovered = self._discovered.get(name)
        if discovered is not None:
            return discovered.provider.display_name
        return self.catalog.get(name).shown_name if name in self.catalog else name

    # -- resolution ------------------------------------------------------------------------------------
    async def resolve(self, name: str) -> ResolvedProvider:
        """The configured catalog entry with every endpoint known."""
        return await self.resolve_entry(self.catalog.require_configured(name))

    async def resolve_entry(self, entry: ProviderEntry) -> ResolvedProvider:
        """`entry` with every endpoint known: written out, or read from its discovery document (cached).

        A document is read again after `discovery_ttl` seconds; if that read fails, the one read before keeps
        serving (and the next use tries again a minute later). A failure with nothing read before raises
        DiscoveryError and is not remembered: the next use tries again.
        """
        if entry.discovery_url is None:
            static = self._static.get(entry.name)
            if static is None or static.entry is not entry:
                static = ResolvedProvider.from_entry(entry)
                static = self._static[entry.name] = replace(static, client_keys=self.client_keys)
            return static
        cached = self._discovered.get(entry.name)
        if cached is not None and self._monotonic() < cached.fresh_until:
            return cached.provider
        async with self._locks.setdefault(entry.name, asyncio.Lock()):
            cached = self._discovered.get(entry.name)
            now = self._monotonic()
            if cached is not None and now < cached.fresh_until:
                return cached.provider
            try:
                return await self._discover(entry)
            except DiscoveryError as exc:
                if cached is None:
                    raise
                log.warning("%s; the document read before keeps serving (provider %r)", exc, entry.name)
                cached.fresh_until = now + min(RETRY_AFTER_FAILURE, self.discovery_ttl or RETRY_AFTER_FAILURE)
                return cached.provider

    async def rediscover(self, entry: ProviderEntry) -> ResolvedProvider:
        """`entry` resolved from a fresh read of its discovery document (DiscoveryError if that fails), or from
        the catalog alone when it has none. A successful read replaces the cached one."""
        if entry.discovery_url is None:
            return await self.resolve_entry(entry)
        async with self._locks.setdefault(entry.name, asyncio.Lock()):
            return await self._discover(entry)

    async def _discover(self, entry: ProviderEntry) -> ResolvedProvider:
        assert entry.discovery_url is not None
        with self.metrics.provider_call(entry.name, ProviderEndpoint.DISCOVERY):
            provider = await discover(entry, entry.discovery_url, self.http.client(entry.name))
        provider = replace(provider, client_keys=self.client_keys)
        self._discovered[entry.name] = _Discovered(provider, self._monotonic() + self.discovery_ttl)
        return provider

    def invalidate(self, name: str) -> None:
        """Read the provider's discovery document again at next use (its endpoints may have moved)."""
        cached = self._discovered.get(name)
        if cached is not None:
            cached.fresh_until = 0.0

    def http_client(self, provider: ResolvedProvider) -> httpx.AsyncClient:
        """The provider's long-lived, pooled client."""
        return self.http.client(provider.name)

    def api_client(
        self,
        provider: ResolvedProvider,
        *,
        auth: httpx.Auth,
        secret_headers: Collection[str],
        client_kwargs: Mapping[str, Any],
    ) -> httpx.AsyncClient:
        """A client for the provider's API over its pool, with `auth`, which writes the grant's secret into
        `secret_headers` or a credential entry's query parameters (close it after use; the pool stays). The
        requests it hands back (`response.request`, ...) are copies without them."""
        return self.http.api_client(
            provider.name,
            base_url=provider.api_base_url or "",
            auth=auth,
            secret_headers=secret_headers,
            secret_parameters=credentials.secret_parameters(provider.entry),
            client_kwargs=client_kwargs,
        )

    def connection_values(self, name: str, given: Mapping[str, str] | None) -> dict[str, str]:
        """The per-connection values an agent gave for `name`, checked (see `ProviderEntry.connection_values`)."""
        return self.catalog.get(name).connection_values(given)

    def bind(self, provider: Provider, values: Mapping[str, str]) -> ResolvedProvider:
        """`provider` with its endpoints filled from a connection's values (see `ResolvedProvider.bound`)."""
        return _resolved(provider).bound(values)

    # -- the authorization code flow -------------------------------------------------------------------
    async def authorization_request(
        self, provider: Provider, *, redirect_uri: str, scopes: Sequence[str], account: AccountAsk | None = None
    ) -> AuthorizationRequest:
        """A new authorization request: its URL (pushed to the provider first where PAR is used) and its secrets;
        `account`: which account it is for (`authorize.account_params`)."""
        provider = _resolved(provider)
        flow = new_flow_secrets(provider)
        if provider.par_reason is None:
            url = authorization_url(provider, redirect_uri=redirect_uri, scopes=scopes, flow=flow, account=account)
        else:
            params = authorization_params(
                provider, redirect_uri=redirect_uri, scopes=scopes, flow=flow, account=account
            )
            url = await self._call(
                provider, ProviderEndpoint.PAR, pushed_authorization_url(provider, self.http_client(provider), params)
            )
        return AuthorizationRequest(url, flow.state, flow.code_verifier, flow.nonce, provider.issuer)

    def issuer_acceptable(self, provider: Provider, expected: str | None, received: str | None) -> bool:
        return issuer_acceptable(_resolved(provider), expected, received)

    async def exchange_code(
        self, provider: ResolvedProvider, *, redirect_uri: str, code: str, code_verifier: str | None, now: datetime
    ) -> TokenSet:
        """Redeem an authorization code at the token endpoint (RFC 6749 §4.1.3)."""
        return await self._call(
            provider,
            ProviderEndpoint.TOKEN,
            token.exchange_code(
                provider,
                self.http_client(provider),
                redirect_uri=redirect_uri,
                code=code,
                code_verifier=code_verifier,
                now=now.timestamp(),
                dpop=Dpop(DpopKey.generate(), self.dpop_nonces) if provider.entry.dpop else None,
            ),
        )

    async def validate_id_token(
        self, provider: ResolvedProvider, id_token: str | None, expect: IdTokenExpectations, *, now: datetime
    ) -> dict[str, Any]:
        """Check an ID token in full against the provider's keys (IdTokenError names the failed check)."""
        return await validate_id_token(
            provider, id_token, expect, jwks=self.jwks, http=self.http_client(provider), now=now.timestamp()
        )

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
        issued_after: datetime | None = None,
        callback: Mapping[str, str] | None = None,
    ) -> Authorized:
        """Exchange the code; for OpenID providers check the ID token in full; learn the provider account.

        The grant's per-connection values are those `provider` was bound with, those the callback's parameters
        carry (QuickBooks' realmId) and those of the token response (Salesforce's instance_url)."""
        provider = _resolved(provider)
        provider = provider.bound(callback_values(provider, callback or {}))
        tokens = await self.exchange_code(
            provider, redirect_uri=redirect_uri, code=code, code_verifier=code_verifier, now=now
        )
        for value in provider.quirks.values_from("token_response"):
            if value.name not in tokens.connection:
                raise ProviderError(
                    f"{provider.display_name} token response has no {value.name} at {value.pointer} "
                    f"({provider.name}.connection.{value.name})",
                    code="provider_token_error",
                )
        provider = provider.bound(tokens.connection)
        tokens = replace(tokens, connection=dict(provider.connection))
        id_claims = None
        if provider.oidc:
            if expected_issuer is None:
                raise ProviderError(
                    f"{provider.display_name} has no issuer to check ID tokens against (provider '{provider.name}')",
                    code="provider_misconfigured",
                )
            # Checked before anything is stored: the account is the ID token's `sub`, signed by the issuer
            # this very request expected, for our client, with the nonce this browser's request carried.
            expect = IdTokenExpectations(
                issuer=expected_issuer,
                nonce=nonce,
                issued_after=issued_after.timestamp() if issued_after is not None else None,
            )
            id_claims = await self.validate_id_token(provider, tokens.id_token, expect, now=now)
        account = fetch_account(provider, self.http_client(provider), tokens, id_claims, self.dpop(tokens))
        if provider.userinfo_endpoint is None:  # the account is the ID token's `sub`: no call
            account_id, profile = await account
        else:
            account_id, profile = await self._call(provider, ProviderEndpoint.USERINFO, account)
        return Authorized(tokens, account_id, account_label({**(id_claims or {}), **profile}))

    async def profile(
        self, provider: ResolvedProvider, tokens: TokenSet, id_claims: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The userinfo answer (OpenID Connect Core 5.3) for a sign-in whose ID token was checked: it must name the
        same `sub`. {} when the provider has no userinfo endpoint."""
        endpoint = provider.userinfo_endpoint
        if endpoint is None:
            return {}

        async def fetch() -> dict[str, Any]:
            headers = {"Authorization": f"Bearer {tokens.access_token}", "Accept": "application/json"}
            response = await self.http_client(provider).get(endpoint, headers=headers)
            try:
                body = response.json() if response.status_code == 200 else None
            except ValueError:
                body = None
            if not isinstance(body, dict) or str(body.get("sub")) != str(id_claims.get("sub")):
                raise ProviderError(
                    f"{provider.display_name} userinfo did not answer for the signed-in account",
                    code="provider_bad_response",
                )
            return body

        return await self._call(provider, ProviderEndpoint.USERINFO, fetch())

    # -- credential entries (API keys, HTTP Basic) ---------------------------------------------------------
    def credential_form(self, name: str) -> CredentialForm | None:
        return credentials.form_of(self.catalog.get(name))

    def entry_kind(self, name: str) -> str:
        return self.catalog.get(name).kind

    def credential_problems(self, name: str, values: Mapping[str, str]) -> dict[str, str]:
        return credentials.spec_of(self.catalog.get(name)).problems(values)

    def credential_hint(self, name: str, values: Mapping[str, str]) -> str:
        return credentials.spec_of(self.catalog.get(name)).hint(values)

    async def check_credential(self, provider: Provider, values: Mapping[str, str]) -> CredentialVerdict:
        resolved = _resolved(provider)
        with self.metrics.provider_call(resolved.name, ProviderEndpoint.CREDENTIAL_CHECK):
            verdict = await credentials.check(resolved, self.http_client(resolved), values)
        if verdict.refusal is not None:
            self.metrics.provider_failed(resolved.name, ProviderEndpoint.CREDENTIAL_CHECK)
        return verdict

    # -- using a grant ---------------------------------------------------------------------------------
    async def refresh(
        self, provider: ResolvedProvider, tokens: TokenSet, *, account_id: str, now: datetime
    ) -> TokenSet:
        """New tokens for a grant (RFC 6749 §6). An ID token in the answer must be for the same account, from the
        same issuer, for us (OpenID Connect Core §12.2); if it is not, the new tokens are revoked and refused."""
        fresh = await self._call(
            provider,
            ProviderEndpoint.REFRESH,
            token.refresh(provider, self.http_client(provider), tokens, now=now.timestamp(), dpop=self.dpop(tokens)),
        )
        if provider.oidc and fresh.id_token is not None:
            before = unverified_claims(tokens.id_token) if tokens.id_token else {}
            issuer = before.get("iss") if isinstance(before.get("iss"), str) else provider.issuer
            nonce = before.get("nonce") if isinstance(before.get("nonce"), str) else None
            expect = IdTokenExpectations(issuer=issuer or "", nonce=nonce, nonce_required=False, subject=account_id)
            try:
                await self.validate_id_token(provider, fresh.id_token, expect, now=now)
            except ProviderError:
                await self.revoke(provider, fresh)
                raise
        return fresh

    async def migrate_legacy(self, provider: ResolvedProvider, tokens: TokenSet, *, now: datetime) -> TokenSet:
        """An expiring token and a refresh token for a legacy grant's token (`token.migrate_legacy`)."""
        migrating = token.migrate_legacy(provider, self.http_client(provider), tokens, now=now.timestamp())
        return await self._call(provider, ProviderEndpoint.MIGRATION, migrating)

    def dpop(self, tokens: TokenSet) -> Dpop | None:
        """What requests with `tokens` need for DPoP: their key (None for a Bearer token) and the nonces."""
        if tokens.dpop_key is None:
            return None
        return Dpop(DpopKey.from_jwk(tokens.dpop_key), self.dpop_nonces)

    async def revoke(self, provider: ResolvedProvider, tokens: TokenSet) -> bool:
        if provider.revocation_endpoint is None:
            return False
        with self.metrics.provider_call(provider.name, ProviderEndpoint.REVOCATION):
            revoked = await revoke(provider, self.http_client(provider), tokens)
        if not revoked:  # best effort: a refusal is not raised, but it is an error of that endpoint
            self.metrics.provider_failed(provider.name, ProviderEndpoint.REVOCATION)
        return revoked

    async def _call(self, provider: ResolvedProvider, endpoint: ProviderEndpoint, call: Awaitable[T]) -> T:
        """Time `call` as a call of `endpoint`; a failing discovered endpoint has the document read again."""
        try:
            with self.metrics.provider_call(provider.name, endpoint):
                return await call
        except EndpointError as exc:
            if exc.transport and provider.discovered:
                self.invalidate(provider.name)  # the endpoint may have moved: read the document again
            raise


def _resolved(provider: Provider) -> ResolvedProvider:
    """The core hands back what `resolve` gave it; anything else is a programming error."""
    if not isinstance(provider, ResolvedProvider):
        raise TypeError(f"expected a ResolvedProvider, got {type(provider).__name__}")
    return provider
