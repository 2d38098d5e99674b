"""A provider configured by its discovery URL only, on a real loopback server: the whole life of a grant, and what
a broken discovery document does (a 502 page at connect time, a warning at startup, `providers check`).

The provider is `MockOIDCProvider` served by uvicorn; the catalog names only its discovery document (and the API
base URL, which discovery does not give). Every other endpoint the connector uses is the one the document names.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from service import NotAuthorized
from service.store.tables import oauth_flows
from service.testing import MockOIDCProvider, ScriptedBrowser
from service.testing.mock_provider import MockResponse

from .conftest import Deployment, deploy, write_catalog
from .flow_support import asking

NAME = "acme-internal"  # the catalog key: an operator's label, never shown to users
ENV = NAME.upper().replace("-", "_")


@pytest.fixture
async def idp() -> AsyncIterator[MockOIDCProvider]:
    provider = MockOIDCProvider()
    async with provider.serve_http():
        yield provider


def discovery_only(discovery_url: str, api_base_url: str) -> dict[str, Any]:
    return {
        "discovery_url": discovery_url,
        "oidc": True,
        "account_id_field": "sub",
        "default_scopes": ["email"],
        "api_base_url": api_base_url,
    }


@asynccontextmanager
async def deployed(
    connector_env: dict[str, str],
    tmp_path: Path,
    idp: MockOIDCProvider,
    sock: socket.socket,
    discovery_url: str | None = None,
) -> AsyncIterator[Deployment]:
    url = discovery_url or f"{idp.base_url}/.well-known/openid-configuration"
    catalog = write_catalog(tmp_path / "discovery.toml", {NAME: discovery_only(url, f"{idp.base_url}/api")})
    env = {
        "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
        f"CONNECTOR_PROVIDER_{ENV}_CLIENT_ID": idp.client_id,
        f"CONNECTOR_PROVIDER_{ENV}_CLIENT_SECRET": idp.client_secret,
    }
    async with deploy(connector_env, tmp_path, idp, sock, None, **env) as deployment:
        yield deployment


def refreshes(idp: MockOIDCProvider) -> int:
    return sum(1 for r in idp.token_requests if r["grant_type"] == "refresh_token")


async def test_connect_use_expire_refresh_once_disconnect_revokes(
    connector_env: dict[str, str], tmp_path: Path, idp: MockOIDCProvider, loopback_socket: socket.socket
) -> None:
    async with (
        deployed(connector_env, tmp_path, idp, loopback_socket) as deployment,
        asking(deployment) as ask,
        ScriptedBrowser() as browser,
    ):
        connector, user = deployment.connector, deployment.local_user
        pending = await ask(provider=NAME, scopes=["email"])
        page = await browser.get(pending.url)
        assert "127.0.0.1" in page.text and NAME not in page.text  # the issuer's host, not the catalog key
        final = await browser.follow(await browser.submit(page, "continue"))
        assert final.status_code == 200, final.text
        outcome = await pending.outcome()
        assert outcome.ok
        assert outcome.describe() == "Access to 127.0.0.1 was granted."

        # Use: the token goes to the API named in the catalog.
        async with connector.http(user, NAME) as api:
            assert (await api.get("user")).status_code == 200
        assert refreshes(idp) == 0

        # The token expires, at the provider and by the connector's clock: the next call refreshes once.
        idp.expire_access_tokens()
        assert idp.expires_in is not None
        connector.clock.advance(timedelta(seconds=idp.expires_in + 1))
        calls_before = len(idp.api_calls)
        async with connector.http(user, NAME) as api:
            assert (await api.get("user")).status_code == 200
        assert refreshes(idp) == 1
        assert len(idp.api_calls) - calls_before == 1  # refreshed before the call: no 401 and retry
        async with connector.http(user, NAME) as api:
            assert (await api.get("user")).status_code == 200
        assert refreshes(idp) == 1

        # Disconnect revokes at the discovered revocation endpoint; the tokens are dead there afterwards.
        access, refresh = idp.issued_access_tokens[-1], idp.issued_refresh_tokens[-1]
        assert idp.token_active(access) and idp.token_active(refresh)
        assert await connector.disconnect(user, NAME) == 1
        assert idp.revocation_requests == [{"token_type_hint": "refresh_token", "client_auth": "client_secret_basic"}]
        assert not idp.token_active(access) and not idp.token_active(refresh)
        async with httpx.AsyncClient() as raw:
            rejected = await raw.get(f"{idp.base_url}/api/user", headers={"Authorization": f"Bearer {access}"})
        assert rejected.status_code == 401
        with pytest.raises(NotAuthorized):
            async with connector.http(user, NAME):
                pass
        # Every provider call went to an endpoint the discovery document named (Basic, as the document allows).
        assert {r["client_auth"] for r in idp.token_requests} == {"client_secret_basic"}


def closed_port_url() -> str:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{closed.getsockname()[1]}/.well-known/openid-configuration"


BROKEN: list[tuple[str, dict[str, Any], str]] = [
    ("unreachable", {"url": "closed"}, "could not be fetched"),
    ("not-json", {"answer": MockResponse.text(200, "<html>hello</html>")}, "is not JSON"),
    ("wrong-issuer", {"overrides": {"issuer": "https://other.example.com"}}, "names the issuer https://other.example"),
    ("no-token-endpoint", {"overrides": {"token_endpoint": None}}, "has no token_endpoint"),
    (
        "plain-http-endpoint",
        {"overrides": {"token_endpoint": "http://idp.example.com/token"}},
        "token_endpoint that must use https",
    ),
]


def spoil(idp: MockOIDCProvider, how: dict[str, Any]) -> str | None:
    idp.discovery_overrides = dict(how.get("overrides", {}))
    idp.discovery_answer = how.get("answer")
    return closed_port_url() if how.get("url") == "closed" else None


@pytest.mark.parametrize(("how", "problem"), [(h, p) for _, h, p in BROKEN], ids=[i for i, _, _ in BROKEN])
async def test_a_broken_discovery_document_is_a_502_page_at_connect_time_and_nothing_is_stored(
    connector_env: dict[str, str],
    tmp_path: Path,
    idp: MockOIDCProvider,
    loopback_socket: socket.socket,
    how: dict[str, Any],
    problem: str,
) -> None:
    url = spoil(idp, how)
    async with (
        deployed(connector_env, tmp_path, idp, loopback_socket, url) as deployment,
        asking(deployment) as ask,
        ScriptedBrowser() as browser,
    ):
        pending = await ask(provider=NAME, scopes=["email"])
        page = await browser.get(pending.url)
        assert page.status_code == 502
        assert page.headers["x-connector-error"] == "provider_discovery_failed"
        assert problem in page.text and "127.0.0.1" in page.text
        assert NAME not in page.text and idp.client_secret not in page.text
        # Nothing was stored or sent anywhere: no flow, no grant, no request to the provider's endpoints.
        async with deployment.connector.runtime.store.engine.connect() as conn:
            flows = (await conn.execute(select(func.count()).select_from(oauth_flows))).scalar_one()
        assert flows == 0
        assert await deployment.connector.runtime.store.grants.find(deployment.local_user, NAME) == []
        assert idp.authorization_requests == [] and idp.token_requests == []
        # Mended, the same link works: the failure was not remembered.
        idp.discovery_overrides, idp.discovery_answer = {}, None
        if url is None:
            assert (await browser.get(pending.url)).status_code == 200


async def test_startup_logs_a_broken_provider_and_keeps_serving(
    connector_env: dict[str, str],
    tmp_path: Path,
    idp: MockOIDCProvider,
    loopback_socket: socket.socket,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="service.oauth")
    idp.discovery_overrides = {"token_endpoint": None}
    async with deployed(connector_env, tmp_path, idp, loopback_socket) as deployment:
        task = deployment.connector.runtime.provider_check
        assert task is not None
        (report,) = await asyncio.wait_for(task, 10)
        assert not report.ok and report.field_at_fault == "token_endpoint"
        (line,) = [r for r in caplog.records if r.name == "service.oauth.check"]
        assert line.levelno == logging.WARNING
        assert NAME in line.getMessage() and "has no token_endpoint" in line.getMessage()
        assert getattr(line, "field", None) == "token_endpoint"
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{deployment.base_url}/healthz")).status_code == 200


async def test_providers_check_says_what_is_wrong_and_which_client_authentication_and_why(
    tmp_path: Path, idp: MockOIDCProvider
) -> None:
    broken = MockOIDCProvider(discovery_overrides={"issuer": "https://other.example.com"})
    async with broken.serve_http():
        catalog = write_catalog(
            tmp_path / "providers.toml",
            {
                "good": discovery_only(f"{idp.base_url}/.well-known/openid-configuration", f"{idp.base_url}/api"),
                "bad": discovery_only(f"{broken.base_url}/.well-known/openid-configuration", f"{broken.base_url}/api"),
                "unset": discovery_only("https://sso.example.com/.well-known/openid-configuration", ""),
            },
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
        env.update(
            CONNECTOR_PROVIDERS__CATALOG=str(catalog),
            CONNECTOR_PROVIDER_GOOD_CLIENT_ID=idp.client_id,
            CONNECTOR_PROVIDER_GOOD_CLIENT_SECRET=idp.client_secret,
            CONNECTOR_PROVIDER_BAD_CLIENT_ID=broken.client_id,
            CONNECTOR_PROVIDER_BAD_CLIENT_SECRET=broken.client_secret,
            CONNECTOR_PROVIDERS__GOOD__DEFAULT_SCOPES="openid,offline_access",
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "service.cli",
            "providers",
            "check",
            env=env,
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 60)
    text = out.decode()
    assert process.returncode == 1, (text, err.decode())
    assert "good (127.0.0.1): ok" in text
    assert "client authentication: client_secret_basic (the first of the methods we speak" in text
    assert "signing keys: 1 at" in text
    assert "refresh tokens: offline_access is asked with prompt=consent" in text
    assert "bad (127.0.0.1): PROBLEM" in text
    assert "names the issuer https://other.example.com, which does not match its location" in text
    assert "unset (sso.example.com): skipped" in text
    assert "1 provider(s) with problems: bad" in text
    assert idp.client_secret not in text + err.decode() and broken.client_secret not in text
