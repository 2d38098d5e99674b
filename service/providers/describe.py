"""A catalog entry in words: what it needs (credentials, per-connection values), how it departs from plain OAuth
2.0, where its documentation is. `providers list --details`, `providers check --offline` and docs/providers.md
(`make reference`) all say it this way. No network."""

from __future__ import annotations

from dataclasses import dataclass, field

from .entry import ProviderEntry
from .quirks import Revocation, TokenRequest, TokenResponseShape


@dataclass
class EntryFacts:
    """What an entry needs and does; `problems` stop a connect, `warnings` are the rest (offline findings)."""

    name: str
    shown_name: str
    needs: list[str] = field(default_factory=list)
    quirks: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _token_quirks(request: TokenRequest, shape: TokenResponseShape) -> list[str]:
    lines = []
    if request.encoding == "json":
        lines.append("token request body is JSON")
    if request.exchange_params:
        lines.append("code exchange adds " + ", ".join(f"{k}={v}" for k, v in request.exchange_params.items()))
    if request.refresh_params:
        lines.append("refresh adds " + ", ".join(f"{k}={v}" for k, v in request.refresh_params.items()))
    refresh = {
        "none": "no refresh tokens (the grant is used until its token expires or is revoked)",
        "reusable": "refresh tokens are kept (a new one replaces the old when given)",
        "rotating": "refresh tokens rotate: each refresh must give a new one (single-use)",
    }
    lines.append(refresh[request.refresh_tokens])
    legacy = request.legacy_exchange
    if legacy is not None:
        asked = f", asking {legacy.requested_token_type}" if legacy.requested_token_type else ""
        adds = "".join(f", adds {k}={v}" for k, v in legacy.params.items())
        lines.append(
            "a grant stored with a non-expiring token and no refresh token is migrated by token exchange "
            f"(RFC 8693, {legacy.encoding}: the token as {legacy.subject_token_type}{asked}{adds}) at its next use "
            "or by `acp-connector grants migrate`"
        )
    moved = shape.members()
    if moved:
        lines.append("token response: " + ", ".join(f"{k} at {v}" for k, v in moved.items()))
    if shape.expires_form != "seconds":
        lines.append(f"expiry given as {shape.expires_form.replace('_', ' ')}")
    if shape.ok_flag:
        lines.append(f"errors: {shape.ok_flag} is false")
    if shape.errors_with_200:
        lines.append("errors with HTTP 200: " + ", ".join(shape.errors_with_200))
    if shape.dead_refresh_token_errors != ("invalid_grant",):
        lines.append("refresh errors that need the user again: " + ", ".join(shape.dead_refresh_token_errors))
    return lines


def _revocation(entry: ProviderEntry, style: Revocation) -> str:
    if not entry.revocation_endpoint:
        return "no revocation: disconnect only deletes the grant"
    if style == Revocation():
        return "revocation: RFC 7009"
    carried = f"in {style.token_param}" if style.token_param else "as the credential only"
    auth = {"client": "as the client", "basic": "with HTTP Basic", "bearer": "with the token itself"}[style.auth]
    which = "the access token" if style.token == "access" else "the refresh token (else the access token)"
    headers = "".join(f", {name}: {value}" for name, value in style.headers.items())
    return (
        f"revocation: {style.method} {style.encoding if style.token_param else ''} {auth}, {which} {carried}{headers}"
    )


def credential_facts(entry: ProviderEntry) -> EntryFacts:
    """What a credential entry asks the user for, how it is carried and checked."""
    spec = entry.credential
    assert spec is not None
    facts = EntryFacts(entry.name, entry.shown_name)
    for name, field_spec in spec.fields.items():
        shape = [f"starts with {' or '.join(field_spec.prefix.split('|'))}"] if field_spec.prefix else []
        if field_spec.min_length == field_spec.max_length:
            shape.append(f"{field_spec.min_length} characters")
        if field_spec.characters:
            shape.append(f"characters [{field_spec.characters}]")
        checked = f" ({', '.join(shape)})" if shape else ""
        facts.needs.append(f"the user types {field_spec.label} (`{name}`){checked}: {field_spec.docs_url}")
    if entry.docs_url:
        facts.needs.append(f"documentation: {entry.docs_url}")
    facts.quirks.append(f"{spec.kind}: " + "; ".join(injection.describe() for injection in spec.inject))
    if spec.check is None:
        facts.quirks.append("no check request: stored once its format passes")
    else:
        check = spec.check
        account = f", account at {check.account}" if check.account else ""
        facts.quirks.append(f"check: {check.method} {check.path} expects {', '.join(map(str, check.expect))}{account}")
    facts.quirks.append(
        "disconnect deletes the stored copy; the key stays valid at the provider"
        + (f" (revoke it at {spec.revoke_url})" if spec.revoke_url else "")
    )
    return facts


def _account_choice(entry: ProviderEntry) -> list[str]:
    """How the user picks among several accounts at the provider (service.core.accounts), if the entry says."""
    said = []
    if entry.account_prompt:
        said.append(f"a new account is asked with prompt={entry.account_prompt}")
    if entry.login_hint:
        said.append(f"an account asked again is named with {entry.login_hint}=")
    return ["several accounts: " + ", ".join(said)] if said else []


def entry_facts(entry: ProviderEntry) -> EntryFacts:
    """The entry's needs and quirks (and, for an offline check, what is missing)."""
    if entry.is_credential:
        return credential_facts(entry)
    facts = EntryFacts(entry.name, entry.shown_name)
    quirks = entry.quirks
    facts.needs.append(f"credentials: {entry.client_id_env_var}, {entry.client_secret_env_var}")
    for value in quirks.connection:
        secret = " (secret: not shown in grant metadata)" if value.secret else ""
        facts.needs.append(f"{{{value.name}}}: {value.description or value.name}, {value.origin()}{secret}")
    if entry.docs_url:
        facts.needs.append(f"documentation: {entry.docs_url}")
    if entry.scope_separator != " ":
        facts.quirks.append(f"scopes joined with {entry.scope_separator!r}")
    if quirks.scope_parameter != "scope":
        facts.quirks.append(f"scopes sent as {quirks.scope_parameter}")
    if not entry.pkce:
        facts.quirks.append("no PKCE")
    if entry.extra_authorize_params:
        params = ", ".join(f"{k}={v}" for k, v in entry.extra_authorize_params.items())
        facts.quirks.append(f"authorization adds {params}")
    facts.quirks += _account_choice(entry)
    if entry.token_endpoint_auth_method is not None:
        facts.quirks.append(f"client authentication: {entry.token_endpoint_auth_method}")
    facts.quirks += _token_quirks(quirks.token_request, quirks.token_response)
    if quirks.account_id_source == "token_response":
        facts.quirks.append(f"account id from the token response at {entry.account_id_field}")
    elif quirks.userinfo_method != "GET":
        facts.quirks.append(f"account lookup is {quirks.userinfo_method}")
    if quirks.api_auth.header != "Authorization" or quirks.api_auth.prefix != "Bearer ":
        facts.quirks.append(f"API token in {quirks.api_auth.header}: {quirks.api_auth.prefix}<token>")
    facts.quirks.append(_revocation(entry, quirks.revocation).replace("  ", " "))
    if not entry.has_endpoints:
        facts.warnings.append("no endpoints: set discovery_url (or the endpoints) before it can be used")
    if not entry.has_credentials:
        facts.warnings.append(f"not configured: set {entry.client_id_env_var} and {entry.client_secret_env_var}")
    if not entry.api_base_url:
        facts.warnings.append("no api_base_url: connector.http() and /v1/proxy cannot be used with it")
    return facts
