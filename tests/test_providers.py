"""Provider catalog: the shipped entries, loading rules, credentials from env, and OIDC discovery."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import respx
from pydantic import SecretStr

from service import load_settings
from service.config_warnings import configuration_warnings
from service.core.errors import ConfigError, ConnectorError, ProviderError, ProviderNotConfigured, UnknownProvider
from service.core.records import TokenSet
from service.oauth import ProviderGateway, ResolvedProvider
from service.providers import ProviderCatalog, ProviderEntry, load_catalog, provider_env_var

SHIPPED = Path(__file__).resolve().parent.parent / "config" / "providers.toml"
SECRET = "s3cr3t-value-never-shown"
DISCOVERY = "https://sso.example.com/realms/acme/.well-known/openid-configuration"
ISSUER = "https://sso.example.com/realms/acme"


def creds(name: str) -> dict[str, str]:
    return {provider_env_var(name, "CLIENT_ID"): f"{name}-client", provider_env_var(name, "CLIENT_SECRET"): SECRET}


def catalog_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "providers.toml"
    path.write_text(text, encoding="utf-8")
    return path


MINIMAL = """
[acme]
authorization_endpoint = "https://auth.acme.test/authorize"
token_endpoint = "https://auth.acme.test/token"
"""


def discovery_document(**overrides: object) -> dict[str, object]:
    document: dict[str, object] = {
        "issuer": ISSUER,
        "authorization_endpoint": f"{ISSUER}/protocol/openid-connect/auth",
        "token_endpoint": f"{ISSUER}/protocol/openid-connect/token",
        "userinfo_endpoint": f"{ISSUER}/protocol/openid-connect/userinfo",
        "revocation_endpoint": f"{ISSUER}/protocol/openid-connect/revoke",
        "jwks_uri": f"{ISSUER}/protocol/openid-connect/certs",
        "authorization_response_iss_parameter_supported": True,
        "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
    }
    document.update(overrides)
    return {key: value for key, value in document.items() if value is not None}


def oidc_catalog(**env: str) -> ProviderCatalog:
    return load_catalog(SHIPPED, env={**creds("oidc"), provider_env_var("oidc", "DISCOVERY_URL"): DISCOVERY, **env})


# --- the shipped catalog ----------------------------------------------------------------------------------


def test_shipped_catalog_has_the_documented_providers() -> None:
    catalog = load_catalog(SHIPPED, env={})
    names = [entry.name for entry in catalog.entries()]
    assert len(names) >= 40
    assert {"github", "gitlab", "google", "microsoft", "oidc", "slack", "shopify", "salesforce", "quickbooks"} <= set(
        names
    )
    assert catalog.source == str(SHIPPED)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "github",
            {
                "authorization_endpoint": "https://github.com/login/oauth/authorize",
                "token_endpoint": "https://github.com/login/oauth/access_token",
                "userinfo_endpoint": "https://api.github.com/user",
                "api_base_url": "https://api.github.com",
                "revocation_endpoint": "https://api.github.com/applications/{client_id}/token",
                "default_scopes": ("read:user",),
                "account_id_field": "id",
                "oidc": False,
            },
        ),
        (
            "google",
            {
                "authorization_endpoint": "https://accounts.google.com/o/oauth2/v2/auth",
                "token_endpoint": "https://oauth2.googleapis.com/token",
                "revocation_endpoint": "https://oauth2.googleapis.com/revoke",
                "userinfo_endpoint": "https://openidconnect.googleapis.com/v1/userinfo",
                "issuer": "https://accounts.google.com",
                "oidc": True,
                "account_id_field": "sub",
            },
        ),
        (
            "microsoft",
            {
                # {tenant} is the connection's (the agent's, else the operator's default "common")
                "authorization_endpoint": "https://login.microsoftonline.com/{tenant}/oauth2/v2.0/authorize",
                "token_endpoint": "https://login.microsoftonline.com/{tenant}/oauth2/v2.0/token",
                "userinfo_endpoint": "https://graph.microsoft.com/v1.0/me",
                "api_base_url": "https://graph.microsoft.com",
                "oidc": True,
                "issuer": "https://login.microsoftonline.com/{tenantid}/v2.0",  # the token's own tenant (tid)
                "jwks_uri": "https://login.microsoftonline.com/{tenant}/discovery/v2.0/keys",
                "account_id_field": "id",
            },
        ),
        (
            "gitlab",
            {
                "authorization_endpoint": "https://gitlab.com/oauth/authorize",
                "token_endpoint": "https://gitlab.com/oauth/token",
                "revocation_endpoint": "https://gitlab.com/oauth/revoke",
                "userinfo_endpoint": "https://gitlab.com/api/v4/user",
                "api_base_url": "https://gitlab.com/api/v4",
                "default_scopes": ("read_user",),
            },
        ),
        (
            "slack",
            {
                "authorization_endpoint": "https://slack.com/oauth/v2/authorize",
                "token_endpoint": "https://slack.com/api/oauth.v2.access",
                "userinfo_endpoint": None,  # the user is authed_user.id of the token response
                "account_id_field": "/authed_user/id",
                "scope_separator": ",",
            },
        ),
        (
            "oidc",
            {
                "authorization_endpoint": None,
                "token_endpoint": None,
                "discovery_url": None,
                "oidc": True,
                "account_id_field": "sub",
                "default_scopes": ("openid", "email", "profile"),
            },
        ),
    ],
)
def test_shipped_entries(name: str, expected: dict[str, object]) -> None:
    entry = load_catalog(SHIPPED, env={}).get(name)
    actual = {key: getattr(entry, key) for key in expected}
    assert actual == expected


def test_shipped_endpoints_are_all_https() -> None:
    text = SHIPPED.read_text()
    for entry in load_catalog(SHIPPED, env={}).entries():
        # PKCE is on wherever the provider documents it; an entry without it says so in its comment.
        table = text[text.index(f"\n[{entry.name}]\n") :]
        assert entry.pkce or "PKCE" in table[: table.index("\npkce = false")], entry.name
        for url in (
            entry.authorization_endpoint,
            entry.token_endpoint,
            entry.revocation_endpoint,
            entry.userinfo_endpoint,
            entry.api_base_url,
            entry.issuer,
        ):
            if url is not None and not url.startswith("{"):  # ({instance_url}: checked when the grant gives it)
                assert urlsplit(url).scheme == "https", (entry.name, url)


def test_google_asks_for_a_refresh_token() -> None:
    google = load_catalog(SHIPPED, env={}).get("google")
    assert google.extra_authorize_params["access_type"] == "offline"
    assert google.extra_authorize_params["prompt"] == "consent"


def test_microsoft_tenant_from_env() -> None:
    tenant = "0d5f6c2e-1234-4d3b-9a0e-1f2e3d4c5b6a"
    microsoft = load_catalog(SHIPPED, env={"CONNECTOR_PROVIDER_MICROSOFT_TENANT": tenant}).get("microsoft")
    # The operator's tenant is the default of the per-connection value the agent may give.
    assert microsoft.connection_values(None) == {"tenant": tenant}
    assert microsoft.connection_values({"tenant": "contoso.onmicrosoft.com"}) == {"tenant": "contoso.onmicrosoft.com"}


def test_tenant_key_in_file(tmp_path: Path) -> None:
    path = catalog_file(
        tmp_path,
        """
        [entra]
        tenant = "contoso.onmicrosoft.com"
        authorization_endpoint = "https://login.microsoftonline.com/{tenant}/oauth2/v2.0/authorize"
        token_endpoint = "https://login.microsoftonline.com/{tenant}/oauth2/v2.0/token"
        issuer = "https://login.microsoftonline.com/{tenant}/v2.0"
        """,
    )
    entry = load_catalog(path, env={}).get("entra")
    assert entry.token_endpoint == "https://login.microsoftonline.com/contoso.onmicrosoft.com/oauth2/v2.0/token"
    assert entry.issuer == "https://login.microsoftonline.com/contoso.onmicrosoft.com/v2.0"


def test_bad_tenant_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        load_catalog(SHIPPED, env={"CONNECTOR_PROVIDER_MICROSOFT_TENANT": "evil.com/x?"})
    assert caught.value.key == "microsoft.tenant"
    assert caught.value.file == "environment"


def test_unknown_placeholder_is_refused(tmp_path: Path) -> None:
    path = catalog_file(tmp_path, MINIMAL.replace("/token", "/{region}/token"))
    with pytest.raises(ConfigError) as caught:
        load_catalog(path, env={})
    assert caught.value.key == "acme.token_endpoint"
    assert "{region}" in caught.value.problem


# --- credentials --------------------------------------------------------------------------------------------


def test_credentials_come_from_env() -> None:
    catalog = load_catalog(SHIPPED, env=creds("github"))
    github = catalog.require_configured("github")
    assert github.configured
    assert github.client_id == "github-client"
    assert isinstance(github.client_secret, SecretStr)
    assert github.client_secret.get_secret_value() == SECRET
    assert not catalog.get("gitlab").configured


def test_unconfigured_provider_names_the_env_vars() -> None:
    catalog = load_catalog(SHIPPED, env={})
    with pytest.raises(ProviderNotConfigured) as caught:
        catalog.require_configured("github")
    assert str(caught.value) == (
        "provider 'github' has no client credentials: set CONNECTOR_PROVIDER_GITHUB_CLIENT_ID "
        "and CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET"
    )
    assert caught.value.code == "provider_not_configured"


def test_half_configured_provider_is_refused() -> None:
    catalog = load_catalog(SHIPPED, env={"CONNECTOR_PROVIDER_GITHUB_CLIENT_ID": "only-the-id"})
    assert not catalog.get("github").configured
    with pytest.raises(ProviderNotConfigured, match="CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET"):
        catalog.require_configured("github")


def test_blank_credentials_count_as_absent() -> None:
    env = {"CONNECTOR_PROVIDER_GITHUB_CLIENT_ID": "id", "CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET": "  "}
    assert not load_catalog(SHIPPED, env=env).get("github").configured


def test_dashed_names_use_underscores_in_env(tmp_path: Path) -> None:
    path = catalog_file(tmp_path, MINIMAL.replace("[acme]", "[gitlab-corp]"))
    env = {"CONNECTOR_PROVIDER_GITLAB_CORP_CLIENT_ID": "id", "CONNECTOR_PROVIDER_GITLAB_CORP_CLIENT_SECRET": "x"}
    assert load_catalog(path, env=env).require_configured("gitlab-corp").client_id == "id"
    with pytest.raises(ProviderNotConfigured, match="CONNECTOR_PROVIDER_GITLAB_CORP_CLIENT_ID"):
        load_catalog(path, env={}).require_configured("gitlab-corp")


def test_oidc_without_discovery_url_is_not_configured() -> None:
    catalog = load_catalog(SHIPPED, env=creds("oidc"))
    assert not catalog.get("oidc").configured
    with pytest.raises(ProviderNotConfigured, match="CONNECTOR_PROVIDER_OIDC_DISCOVERY_URL"):
        catalog.require_configured("oidc")


def test_oidc_discovery_url_from_env() -> None:
    entry = oidc_catalog().require_configured("oidc")
    assert entry.discovery_url == DISCOVERY
    assert entry.provider_host == "sso.example.com"


def test_unknown_provider() -> None:
    with pytest.raises(UnknownProvider) as caught:
        load_catalog(SHIPPED, env={}).get("myspace")
    assert "myspace" in str(caught.value)
    assert caught.value.code == "unknown_provider"


def test_secret_is_absent_from_repr_and_str() -> None:
    entry = load_catalog(SHIPPED, env=creds("github")).get("github")
    assert SECRET not in repr(entry)
    assert SECRET not in str(entry)
    assert "github-client" in repr(entry)


# --- refused catalog contents --------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["client_secret", "client_id"])
def test_credentials_in_the_file_are_refused(tmp_path: Path, key: str) -> None:
    path = catalog_file(tmp_path, MINIMAL + f'{key} = "{SECRET}"\n')
    with pytest.raises(ConfigError) as caught:
        load_catalog(path, env={})
    assert caught.value.file == str(path)
    assert caught.value.key == f"acme.{key}"
    assert "CONNECTOR_PROVIDER_ACME_CLIENT_SECRET" in caught.value.problem
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    "key",
    [
        "authorization_endpoint",
        "token_endpoint",
        "revocation_endpoint",
        "userinfo_endpoint",
        "api_base_url",
        "issuer",
        "discovery_url",
    ],
)
def test_http_endpoint_is_refused(tmp_path: Path, key: str) -> None:
    values = {
        "authorization_endpoint": "https://auth.acme.test/authorize",
        "token_endpoint": "https://auth.acme.test/token",
        key: "http://auth.acme.test/x",
    }
    path = catalog_file(tmp_path, "[acme]\n" + "".join(f'{k} = "{v}"\n' for k, v in values.items()))
    with pytest.raises(ConfigError) as caught:
        load_catalog(path, env={})
    assert caught.value.file == str(path)
    assert caught.value.key == f"acme.{key}"
    assert "https" in caught.value.problem


@pytest.mark.parametrize("host", ["127.0.0.1:9000", "localhost:9000", "[::1]:9000"])
def test_http_endpoint_on_loopback_is_allowed(tmp_path: Path, host: str) -> None:
    path = catalog_file(tmp_path, MINIMAL.replace("https://auth.acme.test", f"http://{host}"))
    entry = load_catalog(path, env={}).get("acme")
    assert entry.token_endpoint == f"http://{host}/token"


def test_http_discovery_url_from_env_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        load_catalog(SHIPPED, env={"CONNECTOR_PROVIDER_OIDC_DISCOVERY_URL": "http://sso.example.com/.well-known/x"})
    assert caught.value.file == "environment"
    assert caught.value.key == "oidc.discovery_url"
    assert "CONNECTOR_PROVIDER_OIDC_DISCOVERY_URL" in caught.value.problem


@pytest.mark.parametrize(
    ("extra", "key", "problem"),
    [
        ("colour = 'blue'\n", "acme.colour", "unknown key"),
        ("pkce = 'yes'\n", "acme.pkce", "boolean"),
        ("default_scopes = 'read'\n", "acme.default_scopes", "list"),
        ("token_endpoint_auth_method = 'tls_client_auth'\n", "acme.token_endpoint_auth_method", "client_secret"),
        ("scope_separator = ''\n", "acme.scope_separator", "at least 1"),
        (
            "extra_authorize_params = { redirect_uri = 'https://evil.test' }\n",
            "acme.extra_authorize_params",
            "redirect_uri",
        ),
    ],
)
def test_bad_keys_are_refused(tmp_path: Path, extra: str, key: str, problem: str) -> None:
    path = catalog_file(tmp_path, MINIMAL + extra)
    with pytest.raises(ConfigError) as caught:
        load_catalog(path, env={})
    assert caught.value.file == str(path)
    assert caught.value.key == key
    assert problem in caught.value.problem


def test_top_level_value_is_refused(tmp_path: Path) -> None:
    path = catalog_file(tmp_path, "version = 2\n" + MINIMAL)
    with pytest.raises(ConfigError) as caught:
        load_catalog(path, env={})
    assert caught.value.key == "version"


def test_bad_provider_name_is_refused(tmp_path: Path) -> None:
    path = catalog_file(tmp_path, MINIMAL.replace("[acme]", "[Acme]"))
    with pytest.raises(ConfigError) as caught:
        load_catalog(path, env={})
    assert caught.value.key == "Acme"


def test_missing_catalog_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_catalog(tmp_path / "missing.toml", env={})
    assert caught.value.file == str(tmp_path / "missing.toml")
    assert "not found" in caught.value.problem


def test_catalog_syntax_error(tmp_path: Path) -> None:
    path = catalog_file(tmp_path, "[acme\n")
    with pytest.raises(ConfigError) as caught:
        load_catalog(path, env={})
    assert caught.value.key == "<toml>"
    assert "line 1" in caught.value.problem


# --- entry behaviour ------------------------------------------------------------------------------------


def test_join_scopes_uses_the_separator_and_drops_duplicates() -> None:
    catalog = load_catalog(SHIPPED, env={})
    assert catalog.get("slack").join_scopes(["users:read", "chat:write", "users:read"]) == "users:read,chat:write"
    assert catalog.get("google").join_scopes(["openid", "email", " ", "openid"]) == "openid email"


def test_hosts() -> None:
    github = load_catalog(SHIPPED, env={}).get("github")
    assert github.api_host == "api.github.com"
    assert github.provider_host == "github.com"


def test_display_name_defaults_to_the_providers_host_never_the_table_name(tmp_path: Path) -> None:
    entry = load_catalog(catalog_file(tmp_path, MINIMAL), env={}).get("acme")
    assert entry.display_name is None
    assert entry.shown_name == "auth.acme.test"
    discovery_only = load_catalog(catalog_file(tmp_path, f'[sso]\ndiscovery_url = "{DISCOVERY}"\n'), env={})
    assert discovery_only.get("sso").shown_name == "sso.example.com"


def test_extra_authorize_params_are_read_only() -> None:
    google = load_catalog(SHIPPED, env={}).get("google")
    with pytest.raises(TypeError):
        google.extra_authorize_params["prompt"] = "none"  # type: ignore[index]


def test_duplicate_names_are_refused() -> None:
    entry = ProviderEntry(name="x", display_name="X")
    with pytest.raises(ValueError, match="twice"):
        ProviderCatalog([entry, entry])


# --- resolve and discovery -----------------------------------------------------------------------------


async def test_resolve_static_entry_makes_no_request() -> None:
    catalog = load_catalog(SHIPPED, env=creds("github"))
    with respx.mock(assert_all_mocked=True) as mock:
        entry = await ProviderGateway(catalog).resolve("github")
    assert entry.entry is catalog.get("github")
    assert mock.calls.call_count == 0


async def test_resolve_refuses_unconfigured_before_any_request() -> None:
    catalog = load_catalog(SHIPPED, env={provider_env_var("oidc", "DISCOVERY_URL"): DISCOVERY})
    with respx.mock(assert_all_called=False) as mock:
        route = mock.get(DISCOVERY).respond(json=discovery_document())
        with pytest.raises(ProviderNotConfigured):
            await ProviderGateway(catalog).resolve("oidc")
    assert not route.called


@respx.mock
async def test_resolve_discovers_endpoints_once() -> None:
    route = respx.get(DISCOVERY).respond(json=discovery_document())
    catalog = oidc_catalog()
    gateway = ProviderGateway(catalog)
    first, *others = await asyncio.gather(*(gateway.resolve("oidc") for _ in range(5)))
    again = await gateway.resolve("oidc")
    assert route.call_count == 1
    assert all(other is first for other in others) and again is first
    assert first.issuer == ISSUER
    assert first.authorization_endpoint == f"{ISSUER}/protocol/openid-connect/auth"
    assert first.token_endpoint == f"{ISSUER}/protocol/openid-connect/token"
    assert first.userinfo_endpoint == f"{ISSUER}/protocol/openid-connect/userinfo"
    assert first.revocation_endpoint == f"{ISSUER}/protocol/openid-connect/revoke"
    assert first.authorization_response_iss_parameter_supported is True
    assert first.token_endpoint_auth_method == "client_secret_basic"
    assert first.sign_in_host == "sso.example.com"
    assert first.client_secret is not None and first.client_secret.get_secret_value() == SECRET
    # The catalog's own entry is untouched: resolution returns a new entry.
    assert catalog.get("oidc").token_endpoint is None


@respx.mock
async def test_resolve_switches_to_a_supported_auth_method() -> None:
    respx.get(DISCOVERY).respond(json=discovery_document(token_endpoint_auth_methods_supported=["client_secret_post"]))
    entry = await ProviderGateway(oidc_catalog()).resolve("oidc")
    assert entry.token_endpoint_auth_method == "client_secret_post"


@respx.mock
async def test_resolve_rfc8414_metadata_location() -> None:
    url = "https://as.example.com/.well-known/oauth-authorization-server/tenant1"
    respx.get(url).respond(
        json=discovery_document(
            issuer="https://as.example.com/tenant1",
            authorization_endpoint="https://as.example.com/tenant1/authorize",
            token_endpoint="https://as.example.com/tenant1/token",
        )
    )
    entry = await ProviderGateway(oidc_catalog(CONNECTOR_PROVIDER_OIDC_DISCOVERY_URL=url)).resolve("oidc")
    assert entry.issuer == "https://as.example.com/tenant1"


@respx.mock
async def test_resolve_on_loopback_http() -> None:
    base = "http://127.0.0.1:9999"
    url = f"{base}/.well-known/openid-configuration"
    respx.get(url).respond(
        json={
            "issuer": base,
            "authorization_endpoint": f"{base}/authorize",
            "token_endpoint": f"{base}/token",
            "jwks_uri": f"{base}/jwks",  # required for an OpenID provider (oidc = true)
        }
    )
    entry = await ProviderGateway(oidc_catalog(CONNECTOR_PROVIDER_OIDC_DISCOVERY_URL=url)).resolve("oidc")
    assert entry.token_endpoint == f"{base}/token"
    assert entry.authorization_response_iss_parameter_supported is False  # absent means false (RFC 9207 §3)
    assert entry.userinfo_endpoint is None


@respx.mock
async def test_endpoints_pinned_in_the_catalog_win(tmp_path: Path) -> None:
    path = catalog_file(
        tmp_path,
        f"""
        [sso]
        discovery_url = "{DISCOVERY}"
        userinfo_endpoint = "https://api.example.com/me"
        """,
    )
    respx.get(DISCOVERY).respond(json=discovery_document())
    entry = await ProviderGateway(load_catalog(path, env=creds("sso"))).resolve("sso")
    assert entry.userinfo_endpoint == "https://api.example.com/me"
    assert entry.token_endpoint == f"{ISSUER}/protocol/openid-connect/token"


@pytest.mark.parametrize(
    ("response", "problem"),
    [
        (httpx.Response(500), "HTTP status 500"),
        (httpx.Response(302, headers={"Location": "https://elsewhere.example.com/"}), "HTTP status 302"),
        (httpx.Response(200, text="<html>"), "not JSON"),
        (httpx.Response(200, json=["not", "an", "object"]), "not a JSON object"),
        (httpx.Response(200, json=discovery_document(issuer="https://evil.example.com")), "does not match"),
        (httpx.Response(200, json=discovery_document(token_endpoint=None)), "no token_endpoint"),
        (httpx.Response(200, json=discovery_document(issuer=None)), "no issuer"),
        (
            httpx.Response(200, json=discovery_document(token_endpoint="http://sso.example.com/token")),
            "token_endpoint that must use https",
        ),
        (httpx.Response(200, json=discovery_document(authorization_endpoint=42)), "not a string"),
        (
            httpx.Response(200, json=discovery_document(authorization_response_iss_parameter_supported="yes")),
            "not a boolean",
        ),
        (
            httpx.Response(200, json=discovery_document(token_endpoint_auth_methods_supported=["tls_client_auth"])),
            "lists none of",
        ),
    ],
)
async def test_bad_discovery_documents_fail(response: httpx.Response, problem: str) -> None:
    catalog = oidc_catalog()
    with respx.mock:
        respx.get(DISCOVERY).mock(return_value=response)
        with pytest.raises(ConnectorError) as caught:
            await ProviderGateway(catalog).resolve("oidc")
    assert caught.value.code == "provider_discovery_failed"
    assert problem in str(caught.value)
    assert SECRET not in str(caught.value)


async def test_network_error_fails_and_is_not_cached() -> None:
    gateway = ProviderGateway(oidc_catalog())
    with respx.mock:
        respx.get(DISCOVERY).mock(side_effect=httpx.ConnectError("refused"))
        with pytest.raises(ConnectorError) as caught:
            await gateway.resolve("oidc")
    assert caught.value.code == "provider_discovery_failed"
    with respx.mock:
        respx.get(DISCOVERY).respond(json=discovery_document())
        assert (await gateway.resolve("oidc")).issuer == ISSUER


async def test_configured_issuer_must_match_the_document(tmp_path: Path) -> None:
    url = "https://sso.example.com/custom/metadata.json"  # a location that implies no issuer
    path = catalog_file(tmp_path, f'[sso]\ndiscovery_url = "{url}"\nissuer = "https://other.example.com"\n')
    with respx.mock:
        respx.get(url).respond(json=discovery_document())
        with pytest.raises(ConnectorError, match="is not the configured"):
            await ProviderGateway(load_catalog(path, env=creds("sso"))).resolve("sso")


async def test_discovery_is_read_again_after_its_ttl_and_a_failed_read_keeps_the_old_one() -> None:
    now = [1000.0]
    gateway = ProviderGateway(oidc_catalog(), discovery_ttl=300, monotonic=lambda: now[0])
    with respx.mock:
        route = respx.get(DISCOVERY).respond(json=discovery_document())
        first = await gateway.resolve("oidc")
        now[0] += 299
        assert await gateway.resolve("oidc") is first and route.call_count == 1
        now[0] += 2  # past the TTL: read again
        moved = f"{ISSUER}/protocol/openid-connect/token2"
        route.respond(json=discovery_document(token_endpoint=moved))
        assert (await gateway.resolve("oidc")).token_endpoint == moved
        assert route.call_count == 2
        now[0] += 301
        route.respond(500)  # the provider is down: the document read before keeps serving
        assert (await gateway.resolve("oidc")).token_endpoint == moved
        assert route.call_count == 3
        assert (await gateway.resolve("oidc")).token_endpoint == moved
        assert route.call_count == 3  # and is not asked again on every use
        now[0] += 61
        route.respond(json=discovery_document())
        assert (await gateway.resolve("oidc")).token_endpoint == f"{ISSUER}/protocol/openid-connect/token"
        assert route.call_count == 4


async def test_a_failing_discovered_endpoint_makes_the_document_read_again() -> None:
    gateway = ProviderGateway(oidc_catalog())
    with respx.mock:
        discovery = respx.get(DISCOVERY).respond(json=discovery_document())
        provider = await gateway.resolve("oidc")
        respx.post(provider.token_endpoint).respond(404)
        tokens = TokenSet("at", "Bearer", "rt", None, None)
        with pytest.raises(ProviderError, match="HTTP 404"):
            await gateway.refresh(provider, tokens, account_id="a", now=datetime.now(UTC))
        await gateway.resolve("oidc")
        assert discovery.call_count == 2
    await gateway.aclose()


# --- CONNECTOR_PROVIDERS__<NAME>__<KEY> ------------------------------------------------------------------


def test_every_catalog_key_can_come_from_the_environment() -> None:
    catalog = oidc_catalog(
        CONNECTOR_PROVIDERS__OIDC__API_BASE_URL="https://api.example.com/v1",
        CONNECTOR_PROVIDERS__OIDC__DISPLAY_NAME="Acme SSO",
        CONNECTOR_PROVIDERS__OIDC__DEFAULT_SCOPES="openid, email,offline_access",
        CONNECTOR_PROVIDERS__OIDC__PKCE="false",
        CONNECTOR_PROVIDERS__OIDC__TOKEN_ENDPOINT_AUTH_METHOD="client_secret_post",
        CONNECTOR_PROVIDERS__OIDC__EXTRA_AUTHORIZE_PARAMS='{"prompt": "login"}',
    )
    entry = catalog.get("oidc")
    assert entry.api_base_url == "https://api.example.com/v1"
    assert entry.shown_name == "Acme SSO"
    assert entry.default_scopes == ("openid", "email", "offline_access")
    assert entry.pkce is False
    assert entry.token_endpoint_auth_method == "client_secret_post"
    assert dict(entry.extra_authorize_params) == {"prompt": "login"}
    # The newer name wins over the older single-variable override.
    both = oidc_catalog(
        CONNECTOR_PROVIDERS__OIDC__DISCOVERY_URL="https://other.example.com/.well-known/openid-configuration"
    )
    assert both.get("oidc").discovery_url == "https://other.example.com/.well-known/openid-configuration"


def test_a_provider_can_be_described_by_the_environment_alone() -> None:
    catalog = load_catalog(
        SHIPPED,
        env={
            **creds("authentik"),
            "CONNECTOR_PROVIDERS__AUTHENTIK__DISCOVERY_URL": DISCOVERY,
            "CONNECTOR_PROVIDERS__AUTHENTIK__OIDC": "true",
            "CONNECTOR_PROVIDERS__AUTHENTIK__ACCOUNT_ID_FIELD": "sub",
        },
    )
    entry = catalog.require_configured("authentik")
    assert entry.oidc and entry.discovery_url == DISCOVERY and entry.shown_name == "sso.example.com"


@pytest.mark.parametrize(
    ("variable", "value", "key", "problem"),
    [
        ("CONNECTOR_PROVIDERS__OIDC__PKCE", "maybe", "oidc.pkce", "true or false"),
        ("CONNECTOR_PROVIDERS__OIDC__API_BASE_URL", "http://api.example.com", "oidc.api_base_url", "https"),
        ("CONNECTOR_PROVIDERS__OIDC__NO_SUCH_KEY", "x", "oidc.no_such_key", "unknown key"),
        ("CONNECTOR_PROVIDERS__OIDC__EXTRA_AUTHORIZE_PARAMS", "prompt=login", "oidc.extra_authorize_params", "JSON"),
        (
            "CONNECTOR_PROVIDERS__OIDC__TOKEN_ENDPOINT_AUTH_METHOD",
            "tls_client_auth",
            "oidc.token_endpoint_auth_method",
            "",
        ),
        (
            "CONNECTOR_PROVIDERS__OIDC__CLIENT_SECRET",
            SECRET,
            "oidc.client_secret",
            "CONNECTOR_PROVIDER_OIDC_CLIENT_SECRET",
        ),
    ],
)
def test_bad_environment_values_name_the_variable(variable: str, value: str, key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        oidc_catalog(**{variable: value})
    assert caught.value.file == "environment" and caught.value.key == key
    assert problem in str(caught.value)
    if variable.endswith("CLIENT_SECRET"):
        assert SECRET not in str(caught.value)
    else:
        assert f"set by {variable}" in str(caught.value)


def test_pool_options_are_refused_for_an_api_client() -> None:
    gateway = ProviderGateway(load_catalog(SHIPPED, env=creds("github")))
    provider = ResolvedProvider.from_entry(gateway.entry("github"))
    with pytest.raises(TypeError, match="verify"):
        gateway.api_client(provider, auth=httpx.BasicAuth("a", "b"), secret_headers=(), client_kwargs={"verify": False})


def test_provider_variables_are_settings_and_an_environment_only_provider_is_pointed_out() -> None:
    env = {
        "CONNECTOR_PROVIDERS__CATALOG": str(SHIPPED),
        "CONNECTOR_PROVIDERS__OIDC__API_BASE_URL": "https://api.example.com",  # a setting: no warning
        "CONNECTOR_PROVIDERS__GITHB__API_BASE_URL": "https://api.github.com",  # adds a provider 'githb'
    }
    warnings = dict(configuration_warnings(load_settings(env=env)))
    assert list(warnings) == ["providers.githb"]
    assert "described only by CONNECTOR_PROVIDERS__GITHB__* variables" in warnings["providers.githb"]
    assert "a misspelling of 'github'?" in warnings["providers.githb"]


GOOGLE_EMAIL = "https://www.googleapis.com/auth/userinfo.email"


@pytest.mark.parametrize(
    ("answered", "refresh_token", "granted"),
    [
        # Google: the scopes asked for by name come back as URLs.
        (f"openid {GOOGLE_EMAIL}", None, {"openid", "email", GOOGLE_EMAIL}),
        # Microsoft: openid and offline_access are left out of `scope`; the refresh token tells offline access.
        ("User.Read profile", "rt", {"User.Read", "profile", "openid", "offline_access"}),
        # A conformant provider that dropped offline_access: no refresh token, so it is not granted.
        ("openid offline_access email", None, {"openid", "email"}),
    ],
)
async def test_granted_scopes_are_named_as_asked(answered: str, refresh_token: str | None, granted: set[str]) -> None:
    catalog = oidc_catalog(CONNECTOR_PROVIDERS__OIDC__SCOPE_ALIASES=f'{{"email": "{GOOGLE_EMAIL}"}}')
    gateway = ProviderGateway(catalog)
    with respx.mock:
        respx.get(DISCOVERY).respond(json=discovery_document())
        provider = await gateway.resolve("oidc")
        answer = {"access_token": "at", "token_type": "Bearer", "scope": answered}
        if refresh_token is not None:
            answer["refresh_token"] = refresh_token
        respx.post(provider.token_endpoint).respond(json=answer)
        tokens = await gateway.exchange_code(
            provider, redirect_uri="https://c.example/cb", code="c", code_verifier=None, now=datetime.now(UTC)
        )
    await gateway.aclose()
    assert tokens.scopes is not None and set(tokens.scopes) == granted
