"""Calling a provider's endpoint: an authenticated request (a form or JSON body, as the catalog entry says), its
JSON answer, and failures as errors (an OAuth error in an answer of any status: GitHub and Slack answer 200).

Errors carry the provider's OAuth error code (`error`, RFC 6749 §5.2) or the HTTP status, never a response body,
a token or a secret.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from service.core.errors import EndpointError
from service.providers.quirks import RequestEncoding, resolve_pointer

from .client_auth import authenticate
from .dpop import Dpop
from .resolved import ResolvedProvider

_ERROR_CODE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def retry_after(response: httpx.Response, now: float | None = None) -> float | None:
    """The response's Retry-After in seconds from now (None when absent or unreadable; never negative)."""
    value = response.headers.get("retry-after", "").strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def endpoint_error(
    provider: ResolvedProvider,
    action: str,
    *,
    response: httpx.Response | None = None,
    exc: Exception | None = None,
    body: Any = None,
) -> EndpointError:
    """The error for a failed `action` at `provider`, naming the OAuth error code or the HTTP status."""
    error = error_code(provider, body)
    if not (isinstance(error, str) and _ERROR_CODE.fullmatch(error)):
        error = None
    if error is not None:
        detail = f"error={error}"
    elif response is not None:
        detail = f"HTTP {response.status_code}"
    elif exc is not None:
        detail = type(exc).__name__
    else:
        detail = "unreadable response"
    transport = error is None and (response is None or (response.status_code >= 404 and response.status_code != 429))
    return EndpointError(
        f"{provider.display_name} refused the {action} ({detail})",
        error=error,
        status=response.status_code if response is not None else None,
        transport=transport,
        timed_out=isinstance(exc, httpx.TimeoutException),
        retry_after=retry_after(response) if response is not None else None,
    )


def error_code(provider: ResolvedProvider, body: Any) -> str | None:
    """The OAuth error code an answer carries where the provider puts it (`token_response.error`), or None."""
    shape = provider.quirks.token_response
    error = resolve_pointer(body, shape.error) if isinstance(body, dict) else None
    if error is None and shape.ok_flag is not None and isinstance(body, dict):
        if resolve_pointer(body, shape.ok_flag) is False:
            return "unrecognised_error"
    return error if isinstance(error, str) and _ERROR_CODE.fullmatch(error) else None


def refused(provider: ResolvedProvider, body: Any) -> bool:
    """Whether a JSON answer is an error: an error code at the entry's place, or its `ok` member false."""
    if not isinstance(body, dict):
        return False
    shape = provider.quirks.token_response
    if resolve_pointer(body, shape.error) is not None:
        return True
    return shape.ok_flag is not None and resolve_pointer(body, shape.ok_flag) is False


async def post_form(
    provider: ResolvedProvider,
    http: httpx.AsyncClient,
    url: str,
    form: Mapping[str, str],
    action: str,
    *,
    encoding: RequestEncoding = "form",
    dpop: Dpop | None = None,
) -> tuple[httpx.Response, Any]:
    """POST `form`, authenticated as our client, to `url` (form-encoded, or as a JSON object); the response and
    its JSON body (None if not JSON). With `dpop`, each request carries a DPoP proof, and one the provider
    refuses for want of its nonce is made again, once, with the nonce it handed out (RFC 9449 §8).

    Raises EndpointError when the request fails or the answer is an OAuth error (any status, or an error member
    in a 200 answer, as GitHub and Slack send).
    """
    for attempt in range(2):
        headers, data = authenticate(  # a fresh client assertion each time: its jti is single-use
            provider.token_endpoint_auth_method,
            provider.client_id,
            provider.client_secret,
            form,
            assertion=provider.client_assertion,
        )
        if dpop is not None:
            headers["DPoP"] = dpop.proof("POST", url)
        try:
            return await send(
                provider, http, "POST", url, action, headers=headers, body=data, encoding=encoding, dpop=dpop
            )
        except _NonceAsked as asked:
            if attempt:
                raise asked.error from None
    raise AssertionError("unreachable")


class _NonceAsked(Exception):
    """The provider refused a DPoP proof for want of the nonce it just handed out."""

    def __init__(self, error: EndpointError) -> None:
        super().__init__("use_dpop_nonce")
        self.error = error


async def send(
    provider: ResolvedProvider,
    http: httpx.AsyncClient,
    method: str,
    url: str,
    action: str,
    *,
    headers: Mapping[str, str],
    body: Mapping[str, str] | None,
    encoding: RequestEncoding = "form",
    dpop: Dpop | None = None,
) -> tuple[httpx.Response, Any]:
    """One request to a provider endpoint; the response and its JSON body. Raises EndpointError (see post_form)."""
    content: dict[str, Any] = {}
    if body is not None:
        content = {"json": dict(body)} if encoding == "json" else {"data": dict(body)}
    try:
        response = await http.request(method, url, headers={"Accept": "application/json", **headers}, **content)
    except httpx.HTTPError as exc:
        raise endpoint_error(provider, action, exc=exc) from None
    try:
        answer = response.json() if response.content else None
    except ValueError:
        answer = None
    if response.status_code >= 400 or refused(provider, answer):
        error = endpoint_error(provider, action, response=response, body=answer)
        if dpop is not None and dpop.asks_for_nonce(url, response, answer):
            raise _NonceAsked(error)
        raise error
    if dpop is not None:
        dpop.nonces.learn(url, response)
    return response, answer
