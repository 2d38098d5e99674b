"""Pushed authorization requests (RFC 9126): the request's parameters are POSTed to the provider first, authenticated
as our client, and the browser carries only `client_id` and the `request_uri` the provider answered.

Used when the provider's metadata requires it (`require_pushed_authorization_requests`) or the catalog entry asks
for it (`pushed_authorization_requests`); `ResolvedProvider.par_reason` says which.
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx
from authlib.common.urls import add_params_to_uri

from service.core.errors import ProviderError

from .endpoint import post_form
from .resolved import ResolvedProvider

ACTION = "pushed authorization request"


async def pushed_authorization_url(
    entry: ResolvedProvider, http: httpx.AsyncClient, params: Sequence[tuple[str, str]]
) -> str:
    """Push `params` to the provider's PAR endpoint; the URL the browser is sent to (client_id and request_uri).

    EndpointError when the provider refuses; ProviderError when it has no PAR endpoint or answers without a
    usable `request_uri` (RFC 9126 §2.2: 201 with `request_uri` and `expires_in`)."""
    if entry.par_endpoint is None:
        raise ProviderError(
            f"{entry.display_name} has no pushed_authorization_request_endpoint, and {entry.par_reason}",
            code="provider_misconfigured",
        )
    _, body = await post_form(entry, http, entry.par_endpoint, dict(params), ACTION)
    request_uri = body.get("request_uri") if isinstance(body, dict) else None
    if not isinstance(request_uri, str) or not request_uri or len(request_uri) > 2048:
        raise ProviderError(
            f"{entry.display_name} answered the {ACTION} without a usable request_uri", code="provider_token_error"
        )
    query = [("client_id", entry.client_id), ("request_uri", request_uri)]
    return str(add_params_to_uri(entry.authorization_endpoint, query))
