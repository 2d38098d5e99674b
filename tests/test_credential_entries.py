"""Each credential entry of the shipped catalog against a mock of its API: the check request goes to the path the
provider documents, carrying the values the way the provider documents (written here from the providers'
documentation, independently of config/providers.toml), and a refusal is told in words; API calls carry them the
same way, only to the entry's API base."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import respx

from service.core.errors import ConnectorError
from service.oauth import ProviderGateway
from service.oauth.credentials import CredentialInjector
from service.providers import load_catalog

CATALOG = Path(__file__).resolve().parent.parent / "config" / "providers.toml"
HEX32, HEX40 = "0123456789abcdef" * 2, "0123456789abcdef" * 2 + "01234567"


def bearer(value: str) -> dict[str, str]:
    return {"authorization": f"Bearer {value}"}


def basic(user: str, password: str) -> dict[str, str]:
    return {"authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


# name -> (values typed, check method and path, what each request must carry, the account the answer names)
Expected = tuple[dict[str, str], str, str, Callable[[dict[str, str]], dict[str, str]], str | None]
EXPECTED: dict[str, Expected] = {
    "openai": ({"api_key": "sk-proj-" + "A" * 40}, "GET", "/v1/models", lambda v: bearer(v["api_key"]), None),
    "anthropic": (
        {"api_key": "sk-ant-api03-" + "b" * 40},
        "GET",
        "/v1/models",
        lambda v: {"x-api-key": v["api_key"], "anthropic-version": "2023-06-01"},
        None,
    ),
    "stripe": ({"api_key": "sk_test_" + "c" * 30}, "GET", "/v1/account", lambda v: bearer(v["api_key"]), "acct_1"),
    "sendgrid": (
        {"api_key": "SG." + "d" * 22 + "." + "e" * 43},
        "GET",
        "/v3/scopes",
        lambda v: bearer(v["api_key"]),
        None,
    ),
    "datadog": (
        {"api_key": HEX32, "application_key": HEX40},
        "GET",
        "/api/v2/validate_keys",
        lambda v: {"dd-api-key": v["api_key"], "dd-application-key": v["application_key"]},
        None,
    ),
    "twilio": (
        {"account_sid": "AC" + HEX32, "auth_token": HEX32},
        "GET",
        "/2010-04-01/Accounts/AC" + HEX32 + ".json",
        lambda v: basic(v["account_sid"], v["auth_token"]),
        "AC" + HEX32,
    ),
    "linear-key": (
        {"api_key": "lin_api_" + "f" * 40},
        "POST",
        "/graphql",
        lambda v: {"authorization": v["api_key"]},  # no Bearer for personal API keys
        "user-7",
    ),
    "notion-key": (
        {"api_key": "ntn_" + "g" * 46},
        "GET",
        "/v1/users/me",
        lambda v: {**bearer(v["api_key"]), "notion-version": "2022-06-28"},
        "bot-9",
    ),
    "github-pat": (
        {"api_key": "github_pat_" + "H" * 82},
        "GET",
        "/user",
        lambda v: {**bearer(v["api_key"]), "x-github-api-version": "2022-11-28"},
        "583231",
    ),
    "mailgun": ({"api_key": "key-" + HEX32}, "GET", "/v3/domains", lambda v: basic("api", v["api_key"]), None),
    "huggingface": ({"api_key": "hf_" + "i" * 34}, "GET", "/api/whoami-v2", lambda v: bearer(v["api_key"]), "mona"),
    "postmark": (
        {"api_key": "f3b2c1d0-0000-4000-8000-0123456789ab"},
        "GET",
        "/server",
        lambda v: {"x-postmark-server-token": v["api_key"]},
        "12345",
    ),
    "pipedrive": ({"api_key": HEX40}, "GET", "/v1/users/me", lambda v: {"?api_token": v["api_key"]}, "77"),
}
# What each API's answer names the account in (the provider's own shape).
ACCOUNT_BODIES: dict[str, Callable[[str], object]] = {
    "stripe": lambda a: {"id": a, "object": "account"},
    "twilio": lambda a: {"sid": a, "status": "active"},
    "linear-key": lambda a: {"data": {"viewer": {"id": a}}},
    "notion-key": lambda a: {"object": "user", "id": a, "type": "bot"},
    "github-pat": lambda a: {"id": int(a), "login": "octocat"},
    "huggingface": lambda a: {"name": a, "type": "user"},
    "postmark": lambda a: {"ID": int(a), "Name": "server"},
    "pipedrive": lambda a: {"success": True, "data": {"id": int(a)}},
}


def credential_names() -> list[str]:
    return [entry.name for entry in load_catalog(CATALOG, env={}).entries() if entry.is_credential]


def test_the_catalog_has_twelve_or_more_credential_entries_and_each_is_tested_here() -> None:
    names = credential_names()
    assert len(names) >= 12
    assert sorted(names) == sorted(EXPECTED)


def carries(request: httpx.Request, wanted: dict[str, str]) -> bool:
    for name, value in wanted.items():
        if name.startswith("?"):
            if request.url.params.get(name[1:]) != value:
                return False
        elif request.headers.get(name) != value:
            return False
    return True


@pytest.fixture
def gateway() -> ProviderGateway:
    return ProviderGateway(load_catalog(CATALOG, env={}))


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_each_entry_checks_and_injects_as_its_provider_documents(gateway: ProviderGateway, name: str) -> None:
    values, method, path, wanted_of, account = EXPECTED[name]
    assert gateway.credential_problems(name, values) == {}  # a value of the documented shape passes the format check
    wanted = wanted_of(values)
    provider = await gateway.resolve(name)
    base = provider.api_base_url
    assert base is not None

    def api(request: httpx.Request) -> httpx.Response:
        if not carries(request, wanted):
            return httpx.Response(401, json={"error": {"code": "invalid_api_key", "type": "authentication_error"}})
        body = ACCOUNT_BODIES[name](account) if account is not None else {"ok": True}
        return httpx.Response(200, json=body)

    with respx.mock(assert_all_mocked=True) as router:
        check = router.request(method, url__startswith=base.rstrip("/") + path).mock(side_effect=api)
        data = router.get(url__startswith=base.rstrip("/") + "/some/data").mock(side_effect=api)
        verdict = await gateway.check_credential(provider, values)
        assert check.call_count == 1
        assert verdict.refusal is None and verdict.account_id == account
        # A wrong secret of the right shape (the last field: a token, not an account id) is refused, in words.
        last = list(values)[-1]
        wrong = {**values, last: values[last][:-1] + ("0" if values[last][-1] != "0" else "1")}
        refused = await gateway.check_credential(provider, wrong)
        assert refused.refusal is not None and refused.refusal.startswith(f"{provider.display_name} refused")
        assert wrong[last] not in refused.refusal
        # API calls carry the values the same way, and only to the API base.
        async with httpx.AsyncClient(base_url=base, auth=CredentialInjector(provider, values)) as client:
            assert (await client.get("some/data" if base.endswith("/") else "/some/data")).status_code == 200
            with pytest.raises(ConnectorError) as elsewhere:
                await client.get("https://elsewhere.example/steal")
        assert elsewhere.value.code == "credential_host_not_allowed"
        assert data.call_count == 1
