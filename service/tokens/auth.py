"""httpx auth for a grant, only for the provider's API host: `GrantAuth` adds an OAuth grant's token (a bearer
token, or a DPoP-bound one with a proof per request: RFC 9449 §7, `ath`, the origin's nonce, one retry when the server
asks for a new one), `CredentialAuth` a credential grant's values as its catalog entry says; `grant_auth` picks the one
that fits."""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator

import httpx

from service.core.errors import ConnectorError, GrantNeedsUser, NotAuthorized
from service.oauth import ResolvedProvider
from service.oauth.credentials import check_destination, inject, spec_of
from service.oauth.dpop import Dpop

from .access import TokenAccess


@functools.lru_cache(maxsize=64)
def api_origin(api_base_url: str) -> httpx.URL:
    """A provider's API base URL, parsed once (httpx.URL is immutable): every request that carries a token is
    checked against it."""
    return httpx.URL(api_base_url)


class GrantAuth(httpx.Auth):
    """httpx auth that adds the grant's bearer token, only for the provider's API host, and retries once on 401."""

    def __init__(self, tokens: TokenAccess, grant_id: str, provider: ResolvedProvider) -> None:
        self._tokens = tokens
        self._grant_id = grant_id
        self._provider = provider
        if not provider.api_base_url:
            raise ConnectorError(
                f"{provider.display_name} has no api_base_url (provider '{provider.name}')",
                code="provider_misconfigured",
            )
        self._origin = api_origin(provider.api_base_url)

    def _check_destination(self, url: httpx.URL) -> None:
        if (url.scheme, url.host, url.port) != (self._origin.scheme, self._origin.host, self._origin.port):
            raise ConnectorError(
                f"refusing to send {self._provider.display_name} credentials to {url.scheme}://{url.host}: "
                f"only {self._origin.scheme}://{self._origin.host} receives them",
                code="credential_host_not_allowed",
            )

    def _authorize(self, request: httpx.Request, token: str) -> Dpop | None:
        """Put `token` on `request`: in the API's own header, or as a DPoP-bound token with a fresh proof (with the
        origin's nonce, and `ath` the token's hash). The grant's DPoP key and nonces, or None for a Bearer token."""
        dpop = self._tokens.dpop(self._grant_id)
        if dpop is None:
            auth = self._provider.quirks.api_auth  # the API's own header where it has one (Shopify's)
            request.headers[auth.header] = auth.value(token)
        else:
            request.headers["Authorization"] = f"DPoP {token}"
            request.headers["DPoP"] = dpop.proof(request.method, request.url, access_token=token)
        return dpop

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        self._check_destination(request.url)
        token = await self._tokens.access_token(self._grant_id, self._provider)
        dpop = self._authorize(request, token)
        response = yield request
        replayable = isinstance(request.stream, httpx.ByteStream)
        if dpop is not None and response.status_code == 401 and dpop.asks_for_nonce(request.url, response):
            if not replayable:
                return  # a streamed body was spent: the nonce learned serves the next request
            await response.aread()
            self._authorize(request, token)  # RFC 9449 §9: once more, with the nonce it handed out
            response = yield request
        elif dpop is not None:
            dpop.nonces.learn(request.url, response)
        if response.status_code == 401:
            await response.aread()
            try:
                fresh = await self._tokens.access_token(self._grant_id, self._provider, stale=token)
            except GrantNeedsUser:
                raise  # the caller learns why (and that asking the user again heals it)
            except NotAuthorized:
                return
            # A streamed body was spent on the first attempt: the refreshed token serves the next request.
            if fresh != token and replayable:
                self._authorize(request, fresh)
                yield request


class CredentialAuth(httpx.Auth):
    """httpx auth that injects a credential grant's values (a header, HTTP Basic or a query parameter, as the
    catalog entry says), only for the provider's API host. A 401 marks the grant `needs_user` (`key_rejected`) and
    raises GrantNeedsUser: a key the provider no longer accepts is not sent again until the user replaces it."""

    def __init__(self, tokens: TokenAccess, grant_id: str, provider: ResolvedProvider) -> None:
        self._tokens = tokens
        self._grant_id = grant_id
        self._provider = provider
        self._spec = spec_of(provider.entry)
        if not provider.api_base_url:
            raise ConnectorError(
                f"{provider.display_name} has no api_base_url (provider '{provider.name}')",
                code="provider_misconfigured",
            )
        self._origin = api_origin(provider.api_base_url)

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        check_destination(request.url, self._origin, self._provider.display_name)
        values = await self._tokens.credential(self._grant_id, self._provider)
        inject(request, self._spec, values)
        response = yield request
        if response.status_code == 401:
            await response.aread()
            raise await self._tokens.credential_rejected(self._grant_id, self._provider)


def grant_auth(tokens: TokenAccess, grant_id: str, provider: ResolvedProvider) -> httpx.Auth:
    """The auth that carries grant `grant_id` at `provider`: its token (OAuth) or its credential values."""
    if provider.entry.is_credential:
        return CredentialAuth(tokens, grant_id, provider)
    return GrantAuth(tokens, grant_id, provider)


def secret_headers(provider: ResolvedProvider) -> frozenset[str]:
    """The request headers `grant_auth`'s auth may write a grant's secret into at `provider` (lower case): the
    API's token header, Authorization and DPoP; a credential entry's header and HTTP Basic injections."""
    if provider.entry.is_credential:
        injections = spec_of(provider.entry).inject
        return frozenset(
            "authorization" if i.style == "basic" else i.header.lower() for i in injections if i.style != "query"
        )
    return frozenset({provider.quirks.api_auth.header.lower(), "authorization", "dpop"})
