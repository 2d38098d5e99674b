"""The flow in a real browser: Debian's Chromium driven by Playwright, against the mock provider over HTTP.

What only a real browser shows: the CSP lets the consent form's redirect reach the provider, the cookie survives
the round trip with its attributes, and the pages render. Skipped (with the reason) where Chromium is missing;
CI installs it and refuses skips.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
from pathlib import Path

import pytest

from service.testing import MockOAuthProvider, MockOIDCProvider

from .acp_peers import RecordingClient, connect, prompt_text
from .chromium_support import CHROMIUM, FLAGS
from .conftest import deploy, write_catalog
from .flow_support import asking

playwright_api = pytest.importorskip("playwright.async_api", reason="Playwright (pip package) is not installed")
if shutil.which(CHROMIUM) is None:
    pytest.skip(f"real-browser tests need Debian's chromium at {CHROMIUM}", allow_module_level=True)


async def test_consent_and_authorization_in_chromium(
    connector_env: dict[str, str], tmp_path: Path, loopback_socket: socket.socket, mock_provider: MockOAuthProvider
) -> None:
    provider = mock_provider  # the instance whose credentials connector_env holds, served over HTTP this time
    async with provider.serve_http():
        catalog = write_catalog(tmp_path / "http_providers.toml", {"github": provider.catalog_entry()})
        async with deploy(
            connector_env, tmp_path, provider, loopback_socket, None, CONNECTOR_PROVIDERS__CATALOG=str(catalog)
        ) as deployment:
            client = RecordingClient(answer="accept")
            wire = await connect(deployment.connector, deployment.local_user, client)
            prompt = asyncio.create_task(wire.client_conn.prompt(session_id="sess-1", prompt=prompt_text("go")))
            url = await client.next_url()

            async with playwright_api.async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
                context = await browser.new_context()
                page = await context.new_page()
                blocked: list[str] = []
                page.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)
                response = await page.goto(url)
                assert response is not None and response.status == 200
                assert await page.locator(".host").inner_text() == "127.0.0.1"  # the provider's host
                await page.screenshot(path=str(tmp_path / "consent.png"))
                cookies = await context.cookies()
                (binding,) = [c for c in cookies if c["name"] == "connector-browser"]
                assert binding["httpOnly"] and binding["sameSite"] == "Lax"

                await page.get_by_role("button", name="Continue to Mock Provider").click()
                await page.wait_for_load_state()
                # Off the provider's redirect: the address bar (and the history entry) holds no code or state.
                elicitation_id = url.rsplit("/", 1)[1]
                assert page.url == f"{deployment.base_url}/connect/{elicitation_id}/done"
                assert await page.locator("h1").inner_text() == "Connected"
                assert "account octocat is connected" in await page.locator("body").inner_text()
                assert blocked == []  # the CSP let the form's redirect go to the provider
                await page.reload()  # told once: a reload names nobody
                assert "octocat" not in await page.locator("body").inner_text()
                await browser.close()

            await asyncio.wait_for(prompt, 10)
            assert wire.agent.outcomes[0].ok
            assert client.completions == [wire.received("elicitation/create")[0]["params"]["elicitationId"]]
            await wire.close()


async def test_consent_in_chromium_for_a_provider_known_only_by_its_discovery_document(
    connector_env: dict[str, str], tmp_path: Path, loopback_socket: socket.socket
) -> None:
    """The consent page's CSP must allow the form to go to the *discovered* authorization endpoint, here on
    another origin than the discovery document (as with many hosted identity providers)."""
    endpoints, front = MockOIDCProvider(), MockOIDCProvider()
    async with endpoints.serve_http(), front.serve_http():
        front.discovery_overrides = {
            "authorization_endpoint": f"{endpoints.base_url}/authorize",
            "token_endpoint": f"{endpoints.base_url}/token",
            "userinfo_endpoint": f"{endpoints.base_url}/api/user",
            "revocation_endpoint": f"{endpoints.base_url}/revoke",
            "jwks_uri": f"{endpoints.base_url}/jwks",
        }
        endpoints.issuer_override = front.issuer  # its ID tokens name the issuer the document states
        discovery_url = f"{front.base_url}/.well-known/openid-configuration"
        catalog = write_catalog(
            tmp_path / "discovery.toml",
            {"sso": {"discovery_url": discovery_url, "oidc": True, "account_id_field": "sub"}},
        )
        env = {
            "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
            "CONNECTOR_PROVIDER_SSO_CLIENT_ID": endpoints.client_id,
            "CONNECTOR_PROVIDER_SSO_CLIENT_SECRET": endpoints.client_secret,
        }
        async with (
            deploy(connector_env, tmp_path, endpoints, loopback_socket, None, **env) as deployment,
            asking(deployment) as ask,
        ):
            pending = await ask(provider="sso", scopes=["email"])
            async with playwright_api.async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
                page = await (await browser.new_context()).new_page()
                blocked: list[str] = []
                page.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)
                response = await page.goto(pending.url)
                assert response is not None and response.status == 200
                assert endpoints.base_url in response.headers["content-security-policy"]
                await page.get_by_role("button", name="Continue to 127.0.0.1").click()
                await page.wait_for_load_state()
                assert page.url.endswith(f"/connect/{pending.elicitation_id}/done"), (page.url, blocked)
                assert await page.locator("h1").inner_text() == "Connected"
                assert blocked == []  # Chromium enforced the CSP and let the form go to the discovered endpoint
                await browser.close()
            assert (await pending.outcome()).ok
        assert len(endpoints.authorization_requests) == 1 and front.authorization_requests == []
