"""`GrantAuth`: httpx auth that adds a grant's bearer token, only for the provider's API host."""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator

import httpx

from service.core.errors import ConnectorError, GrantNeedsUser, NotAuthorized
from service.oauth import ResolvedProvider

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

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        self._check_destination(request.url)
        token = await self._tokens.access_token(self._grant_id, self._provider)
        auth = self._provider.quirks.api_auth  # the API's own header where it has one (Shopify's)
        request.headers[auth.header] = auth.value(token)
        response = yield request
        if response.status_code == 401:
            await response.aread()
            try:
                fresh = await self._tokens.access_token(self._grant_id, self._provider, stale=token)
            except GrantNeedsUser:
                raise  # the caller learns why (and that asking the user again heals it)
            except NotAuthorized:
                return
            # A streamed body was spent on the first attempt: the refreshed token serves the next request.
            if fresh != token and isinstance(request.stream, httpx.ByteStream):
                request.headers[auth.header] = auth.value(fresh)
                yield request
