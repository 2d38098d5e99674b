"""docs/providers.md is generated from config/providers.toml; `providers check --offline` passes over the whole
catalog without any network."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from service.cli.program import main
from service.providers import load_catalog
from service.providers.docs import CATALOG, render

PAGE = Path(__file__).resolve().parent.parent / "docs" / "providers.md"


def test_the_providers_page_is_what_the_catalog_generates() -> None:
    assert PAGE.read_text() == render(), "docs/providers.md is out of date: run `make reference`"


def test_every_entry_names_its_documentation() -> None:
    entries = load_catalog(CATALOG, env={}).entries()
    assert [entry.name for entry in entries if not entry.docs_url] == []
    text = CATALOG.read_text()
    for entry in entries:  # and says it in the entry's comment too
        table = text[text.index(f"\n[{entry.name}]\n") :]
        assert "Docs: " in table[: table.index("docs_url")], entry.name


def test_check_offline_passes_over_the_catalog_without_network(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("providers check --offline opened a connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setenv("CONNECTOR_PROVIDERS__CATALOG", str(CATALOG))
    monkeypatch.delenv("CONNECTOR_CONFIG", raising=False)
    assert main(["providers", "check", "--offline"]) == 0
    out = capsys.readouterr().out
    count = len(load_catalog(CATALOG, env={}))
    assert f"{count} provider(s) checked offline" in out and "PROBLEM" not in out
    assert "errors with HTTP 200: bad_verification_code" in out  # quirks are shown
    assert "{subdomain}: the shop's myshopify.com subdomain, given by the agent" in out


@pytest.mark.asyncio
@pytest.mark.oauth_provider(like="quickbooks")
async def test_the_pytest_plugin_serves_a_mock_like_a_catalog_entry(
    oauth_provider: object, oauth_provider_name: str, agent_env: dict[str, str]
) -> None:
    from service.testing import EmulatedProvider

    assert isinstance(oauth_provider, EmulatedProvider) and oauth_provider_name == "quickbooks"
    catalog = load_catalog(Path(agent_env["CONNECTOR_PROVIDERS__CATALOG"]), env=agent_env)
    entry = catalog.require_configured("quickbooks")  # the entry, on the mock, with the mock's credentials
    assert entry.token_endpoint == f"{oauth_provider.base_url}/oauth.platform.intuit.com/oauth2/v1/tokens/bearer"
    assert [value.name for value in entry.quirks.values_from("callback")] == ["realm_id"]
