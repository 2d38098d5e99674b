"""Token revocation: RFC 7009 by default, or as the catalog entry describes (GitHub's `DELETE` with Basic auth and a
JSON body, Dropbox's bearer call); best effort, the refresh token first."""

from __future__ import annotations

import logging

import httpx

from service.core.errors import ProviderError
from service.core.records import TokenSet
from service.providers.quirks import fill

from .client_auth import authenticate, basic_credentials
from .endpoint import send
from .resolved import ResolvedProvider

log = logging.getLogger("service.oauth")


def revocation_request(entry: ResolvedProvider, token: TokenSet) -> tuple[dict[str, str], dict[str, str] | None]:
    """(headers, body) of the revocation request for `token`, as `entry.quirks.revocation` says."""
    style = entry.quirks.revocation
    use_refresh = style.token == "refresh_first" and token.refresh_token is not None  # noqa: S105 (a mode)
    target = token.refresh_token if use_refresh and token.refresh_token else token.access_token
    body: dict[str, str] = {}
    if style.token_param is not None:
        body[style.token_param] = target
    if style.hint:
        body["token_type_hint"] = "refresh_token" if use_refresh else "access_token"
    headers: dict[str, str] = {}
    if style.auth == "bearer":
        headers[entry.quirks.api_auth.header] = entry.quirks.api_auth.value(token.access_token)
    elif style.auth == "basic":
        if entry.client_secret is None:
            raise ProviderError(
                f"{entry.display_name} revocation needs the client secret", code="provider_misconfigured"
            )
        headers["Authorization"] = basic_credentials(entry.client_id, entry.client_secret.get_secret_value())
    else:
        headers, body = authenticate(
            entry.token_endpoint_auth_method,
            entry.client_id,
            entry.client_secret,
            body,
            assertion=entry.client_assertion,
        )
    return {**style.headers, **headers}, body or None


async def revoke(entry: ResolvedProvider, http: httpx.AsyncClient, token: TokenSet) -> bool:
    """Best-effort revocation. False when the provider has no endpoint or refused."""
    if entry.revocation_endpoint is None:
        return False
    style = entry.quirks.revocation
    url = fill(entry.revocation_endpoint, {"client_id": entry.client_id})  # GitHub's names our client
    try:
        headers, body = revocation_request(entry, token)
        await send(
            entry, http, style.method, url, "revocation",
            headers=headers, body=body, encoding=style.encoding,
        )  # fmt: skip
    except ProviderError as exc:
        log.warning("revocation at %s failed: %s", entry.name, exc)
        return False
    return True
