"""Quirks in the catalog file: a wrong one is a ConfigError naming the file and the key; the token response is read
as the entry says (pointers, expiry forms, errors with 200); per-connection values are checked by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.core.errors import ConfigError, FlowRefused, ProviderError
from service.oauth import ResolvedProvider
from service.oauth.endpoint import refused
from service.oauth.token import token_set
from service.providers import ProviderEntry, load_catalog

BASE = 'authorization_endpoint = "https://a.example/authorize"\ntoken_endpoint = "https://a.example/token"\n'


def entry_of(tmp_path: Path, table: str, env: dict[str, str] | None = None) -> ProviderEntry:
    path = tmp_path / "providers.toml"
    path.write_text(f"[acme]\n{BASE}{table}\n")
    credentials = {"CONNECTOR_PROVIDER_ACME_CLIENT_ID": "id", "CONNECTOR_PROVIDER_ACME_CLIENT_SECRET": "secret"}
    return load_catalog(path, env={**credentials, **(env or {})}).get("acme")


@pytest.mark.parametrize(
    ("table", "key", "problem"),
    [
        ('token_response = { access_token = "authed_user" }', "acme.token_response.access_token", "JSON pointer"),
        ('token_response = { expires_form = "fortnights" }', "acme.token_response.expires_form", "Input should be"),
        ('refresh_tokens = "sometimes"', "acme.refresh_tokens", "Input should be"),
        ('revocation = { method = "PUT" }', "acme.revocation.method", "Input should be"),
        ('revocation = { headers = { Authorization = "x" } }', "acme.revocation.headers", "set by the connector"),
        ('revocation = { headers = { "Notion Version" = "1" } }', "acme.revocation.headers", "not a header name"),
        ('api_base_url = "https://{shop}.example.com"', "acme.api_base_url", "unknown placeholder {shop}"),
        (
            'connection.realm = { source = "callback", pattern = "^[0-9]+$" }',
            "acme.connection.realm.parameter",
            "required",
        ),
        ('connection.url = { source = "token_response", pattern = "^x$" }', "acme.connection.url.pointer", "required"),
        (
            'connection.shop = { source = "agent", pattern = "^[a-z]+$", secret = true }',
            "acme.connection.shop.secret",
            "cannot be secret",
        ),
        (
            'connection.shop = { source = "agent", pattern = "([a-z" }',
            "acme.connection.shop.pattern",
            "not a regular expression",
        ),
        ('extra_token_params = { client_secret = "x" }', "acme.extra_token_params", "may not set client_secret"),
        ("legacy_token_exchange = { params = {} }", "acme.legacy_token_exchange.subject_token_type", "Field required"),
        (
            'legacy_token_exchange = { subject_token_type = "urn:x", params = { subject_token = "x" } }',
            "acme.legacy_token_exchange.params",
            "may not set subject_token",
        ),
        (
            'legacy_token_exchange = { subject_token_type = "urn:x", encoding = "xml" }',
            "acme.legacy_token_exchange.encoding",
            "Input should be",
        ),
        ('legacy_token_exchange = { subject_token_type = "a b" }', "acme.legacy_token_exchange.subject_token_type", ""),
        (
            'refresh_tokens = "none"\nlegacy_token_exchange = { subject_token_type = "urn:x" }',
            "acme.legacy_token_exchange",
            'refresh_tokens = "none" contradicts it',
        ),
    ],
)
def test_a_wrong_quirk_names_the_file_and_the_key(tmp_path: Path, table: str, key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        entry_of(tmp_path, table)
    assert raised.value.file.endswith("providers.toml") and raised.value.key == key
    assert problem in raised.value.problem


def test_an_authorization_url_takes_only_the_agents_values(tmp_path: Path) -> None:
    table = (
        'api_base_url = "{instance_url}/api"\n'
        'connection.instance_url = { source = "token_response", pointer = "/instance_url", pattern = "^https://x$" }'
    )
    assert entry_of(tmp_path, table).api_base_url == "{instance_url}/api"
    path = tmp_path / "providers.toml"
    path.write_text(
        '[acme]\nauthorization_endpoint = "https://{instance_url}/authorize"\ntoken_endpoint = "https://a.example/t"\n'
        'connection.instance_url = { source = "token_response", pointer = "/instance_url", pattern = "^x$" }\n'
    )
    with pytest.raises(ConfigError, match=r"acme\.authorization_endpoint: unknown placeholder"):
        load_catalog(path, env={})


def test_quirks_can_be_set_from_the_environment(tmp_path: Path) -> None:
    connection = '{"shop": {"source": "agent", "pattern": "^[a-z]+$"}}'
    entry = entry_of(
        tmp_path,
        "",
        {"CONNECTOR_PROVIDERS__ACME__CONNECTION": connection, "CONNECTOR_PROVIDERS__ACME__REFRESH_TOKENS": "none"},
    )
    assert entry.quirks.value("shop") is not None and entry.quirks.token_request.refresh_tokens == "none"


def test_a_legacy_token_exchange_can_be_set_from_the_environment(tmp_path: Path) -> None:
    exchange = '{"subject_token_type": "urn:x:offline", "encoding": "json", "params": {"expiring": "1"}}'
    entry = entry_of(tmp_path, "", {"CONNECTOR_PROVIDERS__ACME__LEGACY_TOKEN_EXCHANGE": exchange})
    legacy = entry.quirks.token_request.legacy_exchange
    assert legacy is not None and legacy.subject_token_type == "urn:x:offline" and legacy.params == {"expiring": "1"}
    assert legacy.encoding == "json" and legacy.requested_token_type is None


def test_agent_values_are_refused_by_name(tmp_path: Path) -> None:
    entry = entry_of(tmp_path, 'connection.shop = { source = "agent", pattern = "^[a-z]+$", description = "the shop" }')
    assert entry.connection_values({"shop": "acme"}) == {"shop": "acme"}
    for given, code in [({}, "missing_connection_value"), ({"shop": "a/b"}, "invalid_connection_value")]:
        with pytest.raises(FlowRefused) as refusal:
            entry.connection_values(given)
        assert refusal.value.code == code and refusal.value.detail["name"] == "shop"
    with pytest.raises(FlowRefused) as unknown:
        entry.connection_values({"shop": "acme", "tenant": "x"})
    assert unknown.value.detail["name"] == "tenant"


def test_the_token_response_is_read_where_the_entry_says(tmp_path: Path) -> None:
    table = (
        'token_response = { access_token = "/user/token", scope = "/user/scope", expires = "/expires_at", '
        'expires_form = "epoch_seconds", ok_flag = "/ok" }\nscope_separator = ","'
    )
    provider = ResolvedProvider.from_entry(entry_of(tmp_path, table))
    tokens = token_set({"ok": True, "user": {"token": "t-1", "scope": "a,b"}, "expires_at": 5000}, provider, now=1000.0)
    assert (tokens.access_token, tokens.scopes, tokens.expires_at) == ("t-1", ("a", "b"), 5000.0)
    assert refused(provider, {"ok": False, "error": "invalid_code"})  # an error with HTTP 200
    assert refused(provider, {"ok": False})
    with pytest.raises(ProviderError) as missing:
        token_set({"ok": True, "access_token": "top-level"}, provider, now=1000.0)
    assert missing.value.code == "provider_token_error"
    assert "acme.token_response.access_token" in str(missing.value) and "top-level" not in str(missing.value)


@pytest.mark.parametrize(("form", "given", "expected"), [("milliseconds", 60000, 1060.0), ("seconds", "60", 1060.0)])
def test_expiry_forms(tmp_path: Path, form: str, given: object, expected: float) -> None:
    provider = ResolvedProvider.from_entry(entry_of(tmp_path, f'token_response = {{ expires_form = "{form}" }}'))
    assert token_set({"access_token": "t", "expires_in": given}, provider, now=1000.0).expires_at == expected
    with pytest.raises(ProviderError, match=r"acme.token_response.expires"):
        token_set({"access_token": "t", "expires_in": "soon"}, provider, now=1000.0)
