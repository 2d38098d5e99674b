"""The OAuth client on authlib, and how provider failures become errors that carry no secret."""

from __future__ import annotations

import warnings

import authlib.deprecate  # noqa: F401 - installs an "always" filter that the ignore below must follow
import httpx

with warnings.catch_warnings():
    # authlib 1.9 prefers the `httpx2` fork and warns when it falls back to httpx, which is what we use.
    warnings.filterwarnings("ignore", message="The httpx module is deprecated")
    from authlib.integrations.base_client.errors import OAuthError
    from authlib.integrations.httpx_client import AsyncOAuth2Client

from service.core.errors import ProviderError

from .resolved import ResolvedProvider

HTTP_TIMEOUT = httpx.Timeout(15.0)

__all__ = ["HTTP_TIMEOUT", "AsyncOAuth2Client", "OAuthError", "oauth_client", "provider_error"]


def oauth_client(entry: ResolvedProvider, *, redirect_uri: str | None = None) -> AsyncOAuth2Client:
    secret = entry.client_secret.get_secret_value() if entry.client_secret is not None else None
    return AsyncOAuth2Client(
        client_id=entry.client_id,
        client_secret=secret,
        token_endpoint_auth_method=entry.token_endpoint_auth_method,
        redirect_uri=redirect_uri,
        code_challenge_method="S256" if entry.pkce else None,
        timeout=HTTP_TIMEOUT,
    )


def provider_error(entry: ResolvedProvider, action: str, exc: Exception) -> ProviderError:
    if isinstance(exc, OAuthError):
        detail = f"error={exc.error}"
    elif isinstance(exc, httpx.HTTPStatusError):
        detail = f"HTTP {exc.response.status_code}"
    elif isinstance(exc, httpx.HTTPError):
        detail = type(exc).__name__
    else:
        detail = "unreadable response"
    return ProviderError(f"{entry.display_name} refused the {action} ({detail})", code="provider_token_error")
