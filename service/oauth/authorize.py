"""The authorization request: PKCE S256 (RFC 7636), single-use `state`, OpenID Connect `nonce`, and RFC 9207 `iss`."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from authlib.common.urls import add_params_to_uri
from authlib.oauth2.rfc7636 import create_s256_code_challenge

from service.core.accounts import AccountAsk
from service.core.records import OFFLINE_ACCESS

from .issuer import issuer_matches
from .resolved import ResolvedProvider


@dataclass(frozen=True, slots=True)
class FlowSecrets:
    """Per-transaction values: `state` goes to the provider and back, the verifier never leaves the server."""

    state: str
    code_verifier: str | None
    nonce: str | None

    def __repr__(self) -> str:
        return "FlowSecrets(<redacted>)"


def new_flow_secrets(entry: ResolvedProvider) -> FlowSecrets:
    return FlowSecrets(
        state=secrets.token_urlsafe(32),
        code_verifier=secrets.token_urlsafe(64) if entry.pkce else None,  # 86 chars, within RFC 7636's 43..128
        nonce=secrets.token_urlsafe(24) if entry.oidc else None,
    )


def authorization_scopes(entry: ResolvedProvider, scopes: Sequence[str]) -> str:
    """The `scope` parameter sent: an OpenID Connect provider is always asked for `openid` (so an ID token)."""
    return entry.join_scopes(("openid", *scopes) if entry.oidc else scopes)


def prompt_for(entry: ResolvedProvider, scopes: Sequence[str]) -> str | None:
    """`prompt=consent` when an OpenID provider is asked for `offline_access` (OpenID Connect Core §11: without it
    a conformant provider drops the scope and issues no refresh token), unless the operator set `prompt`."""
    if entry.oidc and OFFLINE_ACCESS in scopes and "prompt" not in entry.extra_authorize_params:
        return "consent"
    return None


def account_params(entry: ResolvedProvider, account: AccountAsk | None) -> list[tuple[str, str]]:
    """What asks the provider for the right account (`service.core.accounts`): for a new one, the `prompt` that
    shows its account chooser (the browser may be signed in to another account there); for one asked again, the
    parameter that names it. Only what the entry declares or the provider advertises (`select_account_prompt`,
    `login_hint_parameter`)."""
    if account is None:
        return []
    if account.new:
        prompt = entry.account_prompt
        return [("prompt", prompt)] if prompt else []
    hint = entry.login_hint
    return [(hint, account.login_hint)] if hint and account.login_hint else []


def _merged_prompts(params: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """One `prompt` parameter with every value asked (OpenID Connect Core §3.1.2.1: space-separated), where the
    first one stood."""
    prompts = [value for name, value in params if name == "prompt"]
    if len(prompts) < 2:
        return params
    joined = " ".join(dict.fromkeys(word for value in prompts for word in value.split()))
    first = next(index for index, (name, _) in enumerate(params) if name == "prompt")
    rest = [(name, value) for name, value in params if name != "prompt"]
    return [*rest[:first], ("prompt", joined), *rest[first:]]


def authorization_url(
    entry: ResolvedProvider,
    *,
    redirect_uri: str,
    scopes: Sequence[str],
    flow: FlowSecrets,
    account: AccountAsk | None = None,
) -> str:
    """The authorization request as a URL, every parameter in its query (no PAR)."""
    params = authorization_params(entry, redirect_uri=redirect_uri, scopes=scopes, flow=flow, account=account)
    return str(add_params_to_uri(entry.authorization_endpoint, params))


def authorization_params(
    entry: ResolvedProvider,
    *,
    redirect_uri: str,
    scopes: Sequence[str],
    flow: FlowSecrets,
    account: AccountAsk | None = None,
) -> list[tuple[str, str]]:
    """The parameters of an authorization request (RFC 6749 §4.1.1, PKCE, nonce, the entry's extra ones, and which
    account: `account_params`)."""
    params: list[tuple[str, str]] = [
        ("response_type", "code"),
        ("client_id", entry.client_id),
        ("redirect_uri", redirect_uri),
        (entry.quirks.scope_parameter, authorization_scopes(entry, scopes)),
        ("state", flow.state),
    ]
    if flow.code_verifier is not None:
        params += [
            ("code_challenge", create_s256_code_challenge(flow.code_verifier)),
            ("code_challenge_method", "S256"),
        ]
    if flow.nonce is not None:
        params.append(("nonce", flow.nonce))
    prompt = prompt_for(entry, scopes)
    if prompt is not None:
        params.append(("prompt", prompt))
    params += [("resource", resource) for resource in entry.entry.resource]  # RFC 8707
    params += list(entry.extra_authorize_params.items())
    return _merged_prompts(params + account_params(entry, account))


def issuer_acceptable(entry: ResolvedProvider, expected: str | None, received: str | None) -> bool:
    """RFC 9207: an authorization response's `iss` (None: absent) must be the expected issuer when the provider
    sends one or promises to; without an expected issuer there is nothing to compare."""
    if expected is None:
        return True
    if received is None:
        return not entry.authorization_response_iss_parameter_supported
    return issuer_matches(expected, received)
