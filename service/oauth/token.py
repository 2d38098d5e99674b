"""The token endpoint (RFC 6749 §4.1.3, §6): redeeming an authorization code, and refresh with rotation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import httpx

from service.core.errors import ProviderError
from service.core.records import OFFLINE_ACCESS, TokenSet
from service.providers.quirks import TOKEN_EXCHANGE_GRANT, RequestEncoding, resolve_pointer

from .dpop import Dpop
from .endpoint import post_form
from .resolved import ResolvedProvider

OPENID = "openid"


def granted_scopes(raw: object) -> tuple[str, ...] | None:
    """The `scope` member of a token response (None when absent: then it is what was asked, RFC 6749 §5.1)."""
    if not isinstance(raw, str):
        return None
    # Providers differ: GitHub and Slack separate granted scopes with commas, others with spaces.
    return tuple(s for s in raw.replace(",", " ").split() if s)


def with_granted_names(tokens: TokenSet, entry: ResolvedProvider) -> TokenSet:
    """The token set with its scopes named as they were asked, so that a grant covers what was granted:
    a scope whose alias the provider answered (`scope_aliases`) is listed by its asked name too; for an OpenID
    provider `openid` is granted (its ID token was checked) and `offline_access` is granted exactly when a refresh
    token came (some providers leave both out of `scope`, and a dropped `offline_access` shows only this way)."""
    if tokens.scopes is None:
        return tokens
    scopes = list(tokens.scopes)
    scopes += [asked for asked, answered in entry.scope_aliases.items() if answered in scopes and asked not in scopes]
    if entry.oidc:
        scopes = [scope for scope in scopes if scope != OFFLINE_ACCESS]
        scopes += [OPENID] if OPENID not in scopes else []
        scopes += [OFFLINE_ACCESS] if tokens.refresh_token is not None else []
    return replace(tokens, scopes=tuple(scopes))


def _token_error(entry: ResolvedProvider, problem: str, key: str) -> ProviderError:
    """The refusal of a token response that does not match the catalog entry: names the provider and the field."""
    return ProviderError(
        f"{entry.display_name} token response {problem} ({entry.name}.token_response.{key})",
        code="provider_token_error",
    )


def _text(raw: Any, pointer: str) -> str | None:
    value = resolve_pointer(raw, pointer)
    return value if isinstance(value, str) and value else None


def _expires_at(raw: Any, entry: ResolvedProvider, now: float) -> float | None:
    """When the access token expires (epoch seconds), read as the entry says the provider gives it."""
    shape = entry.quirks.token_response
    if shape.expires_form == "never":
        return None
    value = resolve_pointer(raw, shape.expires)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _token_error(entry, f"has an unreadable expiry at {shape.expires}", "expires")
    try:
        number = float(value)
    except ValueError:
        raise _token_error(entry, f"has an unreadable expiry at {shape.expires}", "expires") from None
    if shape.expires_form == "milliseconds":
        return now + number / 1000
    if shape.expires_form == "epoch_seconds":
        return number
    return now + number


def _connection_values(raw: Any, entry: ResolvedProvider) -> dict[str, str]:
    """The per-connection values the token response carries (Salesforce's instance_url), each checked."""
    values: dict[str, str] = {}
    for value in entry.quirks.values_from("token_response"):
        assert value.pointer is not None  # the catalog requires it for this source
        text = resolve_pointer(raw, value.pointer)
        if text is None:
            continue  # a refresh may leave it out: the value from the code exchange stays
        if not isinstance(text, str | int) or value.problem(str(text)) is not None:
            raise ProviderError(
                f"{entry.display_name} token response has an unusable {value.name} at {value.pointer} "
                f"({entry.name}.connection.{value.name})",
                code="provider_token_error",
            )
        values[value.name] = str(text)
    return values


def token_set(raw: Any, entry: ResolvedProvider, *, now: float) -> TokenSet:
    """A token response as a `TokenSet`, each member read where the catalog entry says; `now` dates it."""
    shape = entry.quirks.token_response
    if not isinstance(raw, Mapping):
        raise _token_error(entry, "is not a JSON object", "access_token")
    access_token = _text(raw, shape.access_token)
    if access_token is None:
        raise _token_error(entry, f"has no access token at {shape.access_token}", "access_token")
    account = (
        resolve_pointer(raw, entry.account_id_field) if entry.quirks.account_id_source == "token_response" else None
    )
    return TokenSet(
        access_token=access_token,
        token_type=_text(raw, shape.token_type) or "Bearer",
        refresh_token=_text(raw, shape.refresh_token) if entry.quirks.token_request.refresh_tokens != "none" else None,
        expires_at=_expires_at(raw, entry, now),
        scopes=granted_scopes(resolve_pointer(raw, shape.scope)),
        id_token=_text(raw, shape.id_token),
        issued_at=now,
        connection=_connection_values(raw, entry),
        account_id=str(account) if isinstance(account, str | int) and account != "" else None,
    )


async def _token_request(
    entry: ResolvedProvider,
    http: httpx.AsyncClient,
    form: dict[str, str],
    action: str,
    dpop: Dpop | None,
    encoding: RequestEncoding | None = None,
) -> Any:
    encoding = encoding or entry.quirks.token_request.encoding
    _, body = await post_form(entry, http, entry.token_endpoint, form, action, encoding=encoding, dpop=dpop)
    return body


def _resource(entry: ResolvedProvider) -> dict[str, str]:
    """RFC 8707 §2.2: the resource the token is for, at the token endpoint too (one: a form has one value a key)."""
    return {"resource": entry.entry.resource[0]} if len(entry.entry.resource) == 1 else {}


def _bound(tokens: TokenSet, dpop: Dpop | None) -> TokenSet:
    """The token set with its DPoP key kept when the provider bound the token to it (token_type DPoP)."""
    if dpop is not None and tokens.token_type.lower() == "dpop":
        return replace(tokens, token_type="DPoP", dpop_key=dpop.key.private_jwk())  # noqa: S106 (a token type)
    return replace(tokens, dpop_key=None)


async def exchange_code(
    entry: ResolvedProvider,
    http: httpx.AsyncClient,
    *,
    redirect_uri: str,
    code: str,
    code_verifier: str | None,
    now: float,
    dpop: Dpop | None = None,
) -> TokenSet:
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri}
    if code_verifier is not None:
        form["code_verifier"] = code_verifier
    form.update(_resource(entry))
    form.update(entry.quirks.token_request.exchange_params)
    body = await _token_request(entry, http, form, "authorization code exchange", dpop)
    return with_granted_names(_bound(token_set(body, entry, now=now), dpop), entry)


async def refresh(
    entry: ResolvedProvider, http: httpx.AsyncClient, token: TokenSet, *, now: float, dpop: Dpop | None = None
) -> TokenSet:
    """New tokens for `token` (RFC 6749 §6). A provider whose refresh tokens rotate must send a new one; one whose
    refresh tokens are reusable may leave it out (the old one stays); the connection's values carry over."""
    if token.refresh_token is None or entry.quirks.token_request.refresh_tokens == "none":
        raise ProviderError(f"the {entry.display_name} grant cannot be refreshed", code="not_refreshable")
    form = {"grant_type": "refresh_token", "refresh_token": token.refresh_token, **_resource(entry)}
    form.update(entry.quirks.token_request.refresh_params)
    body = await _token_request(entry, http, form, "token refresh", dpop)
    fresh = _bound(token_set(body, entry, now=now), dpop)
    if fresh.refresh_token is None and entry.quirks.token_request.refresh_tokens == "rotating":
        raise _token_error(
            entry, "to a refresh has no new refresh token (this provider's refresh tokens rotate)", "refresh_token"
        )
    return _carried_over(replace(fresh, refresh_token=fresh.refresh_token or token.refresh_token), token, entry)


def is_legacy(entry: ResolvedProvider, token: TokenSet) -> bool:
    """Whether `token` is a legacy grant's set the provider can migrate (its entry's `legacy_token_exchange`): a
    non-expiring access token and no refresh token."""
    return (
        entry.quirks.token_request.legacy_exchange is not None
        and token.refresh_token is None
        and token.expires_at is None
        and not token.credential
    )


async def migrate_legacy(
    entry: ResolvedProvider, http: httpx.AsyncClient, token: TokenSet, *, now: float, dpop: Dpop | None = None
) -> TokenSet:
    """An expiring token and a refresh token for a legacy grant's non-expiring `token` (RFC 8693 token exchange,
    the access token as the subject token, as the entry's `legacy_token_exchange` says). The answer must carry a
    refresh token and an expiry: a grant migrated to another non-expiring token would be migrated again at every
    use. The connection's values and, when the answer names none, the scopes carry over."""
    spec = entry.quirks.token_request.legacy_exchange
    if spec is None or not is_legacy(entry, token):
        raise ProviderError(f"the {entry.display_name} grant cannot be migrated", code="not_migratable")
    form = {
        "grant_type": TOKEN_EXCHANGE_GRANT,
        "subject_token": token.access_token,
        "subject_token_type": spec.subject_token_type,
    }
    if spec.requested_token_type is not None:
        form["requested_token_type"] = spec.requested_token_type
    form.update(spec.params)
    body = await _token_request(entry, http, form, "token migration", dpop, spec.encoding)
    fresh = _bound(token_set(body, entry, now=now), dpop)
    if fresh.refresh_token is None:
        raise _token_error(entry, "to a token migration has no refresh token", "refresh_token")
    if fresh.expires_at is None:
        raise _token_error(entry, "to a token migration has no expiry", "expires")
    return _carried_over(fresh, token, entry)


def _carried_over(fresh: TokenSet, token: TokenSet, entry: ResolvedProvider) -> TokenSet:
    """`fresh`, renewing `token`, with the connection's values and (when the answer names none) the scopes of
    `token` carried over."""
    fresh = replace(fresh, connection={**token.connection, **fresh.connection})
    if fresh.scopes is None:
        return replace(fresh, scopes=token.scopes)
    return with_granted_names(fresh, entry)
