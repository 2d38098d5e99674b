"""Who a token belongs to: the ID token's `sub`, or the userinfo endpoint's account field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from service.core.errors import ProviderError
from service.core.records import TokenSet
from service.providers.quirks import resolve_pointer

from .dpop import Dpop
from .endpoint import endpoint_error
from .resolved import ResolvedProvider

ACCOUNT_ID_MAX_LENGTH = 255  # grants.provider_account_id


async def fetch_account(
    entry: ResolvedProvider,
    http: httpx.AsyncClient,
    token: TokenSet,
    id_claims: Mapping[str, Any] | None = None,
    dpop: Dpop | None = None,
) -> tuple[str, dict[str, Any]]:
    """Who the token belongs to: (provider account id, profile), the id one the grants can hold as it is (printable,
    at most `ACCOUNT_ID_MAX_LENGTH` characters; `provider_bad_response` otherwise, before anything is stored)."""
    account_id, profile = await _fetch_account(entry, http, token, id_claims, dpop)
    if not 0 < len(account_id) <= ACCOUNT_ID_MAX_LENGTH or not account_id.isprintable():
        raise ProviderError(
            f"{entry.display_name} named an account id this connector cannot store (empty, longer than "
            f"{ACCOUNT_ID_MAX_LENGTH} characters, or holding control characters)",
            code="provider_bad_response",
        )
    return account_id, profile


async def _fetch_account(
    entry: ResolvedProvider,
    http: httpx.AsyncClient,
    token: TokenSet,
    id_claims: Mapping[str, Any] | None,
    dpop: Dpop | None,
) -> tuple[str, dict[str, Any]]:
    """Who the token belongs to: (provider account id, profile).

    With validated ID-token claims the account is their `sub` (signed by the provider); the userinfo answer,
    when there is an endpoint, must then name the same `sub` if it names one (OpenID Connect Core 5.3.2).
    Without them the account is the userinfo field `account_id_field` (a name, or a JSON pointer), or, for a
    provider whose token response names the account (`account_id_source = "token_response"`), that one.
    """
    if id_claims is None and token.account_id is not None and entry.quirks.account_id_source == "token_response":
        return token.account_id, {}
    if id_claims is not None:
        subject = str(id_claims["sub"])
        asked = entry.entry.userinfo if entry.entry.userinfo is not None else not entry.entry.resource
        if entry.userinfo_endpoint is None or not asked:
            return subject, {}
        _, profile = await _userinfo(entry, http, token, dpop)
        if "sub" in profile and str(profile["sub"]) != subject:
            raise ProviderError(
                f"{entry.display_name} userinfo names another account than the ID token", code="provider_bad_response"
            )
        return subject, profile
    return await _userinfo(entry, http, token, dpop)


async def _ask(
    entry: ResolvedProvider, http: httpx.AsyncClient, token: TokenSet, url: str, dpop: Dpop | None
) -> httpx.Response:
    """One userinfo request: the token in the API's header, or DPoP-bound with a proof."""
    auth = entry.quirks.api_auth
    headers = {auth.header: auth.value(token.access_token), "Accept": "application/json"}
    method = entry.quirks.userinfo_method
    if dpop is not None:
        headers.pop(auth.header)
        headers["Authorization"] = f"DPoP {token.access_token}"
        headers["DPoP"] = dpop.proof(method, url, access_token=token.access_token)
    body = entry.quirks.userinfo_body
    if body is not None:
        headers["Content-Type"] = "application/json"
    return await http.request(method, url, headers=headers, content=body)


# The profile fields (userinfo or ID token claims) a person recognises their account by, most telling first.
LABEL_FIELDS = ("login", "preferred_username", "email", "username", "name")
LABEL_MAX_LENGTH = 120


def account_label(profile: Mapping[str, Any]) -> str | None:
    """The name the user knows the connected account by (`LABEL_FIELDS`), printable and short, or None."""
    for name in LABEL_FIELDS:
        value = profile.get(name)
        if isinstance(value, str):
            printable = "".join(c for c in value if c.isprintable()).strip()
            if printable:
                return printable[:LABEL_MAX_LENGTH]
    return None


async def _userinfo(
    entry: ResolvedProvider, http: httpx.AsyncClient, token: TokenSet, dpop: Dpop | None = None
) -> tuple[str, dict[str, Any]]:
    if entry.userinfo_endpoint is None:
        if entry.quirks.account_id_source == "token_response":
            raise ProviderError(
                f"{entry.display_name} token response names no account at {entry.account_id_field} "
                f"({entry.name}.account_id_field)",
                code="provider_token_error",
            )
        raise ProviderError(
            f"{entry.display_name} has no userinfo endpoint (provider '{entry.name}')", code="provider_misconfigured"
        )
    try:
        response = await _ask(entry, http, token, entry.userinfo_endpoint, dpop)
        if dpop is not None and response.status_code == 401 and dpop.asks_for_nonce(entry.userinfo_endpoint, response):
            response = await _ask(entry, http, token, entry.userinfo_endpoint, dpop)  # RFC 9449 §9: once more
    except httpx.HTTPError as exc:
        raise endpoint_error(entry, "account lookup", exc=exc) from None
    if not response.is_success:
        raise endpoint_error(entry, "account lookup", response=response)
    try:
        profile = response.json()
    except ValueError:
        raise endpoint_error(entry, "account lookup", response=response) from None
    if not isinstance(profile, dict):
        raise ProviderError(f"{entry.display_name} returned an unreadable profile", code="provider_bad_response")
    field = entry.account_id_field
    account = resolve_pointer(profile, field) if field.startswith("/") else profile.get(field)
    if account is None or account == "" or isinstance(account, dict | list):
        raise ProviderError(
            f"{entry.display_name} profile has no '{entry.account_id_field}' field",
            code="provider_bad_response",
        )
    return str(account), profile
