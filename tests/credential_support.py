"""An API key asked for and typed on the connector's page: a deployment whose catalog has a credential entry at the
keyed mock API (`MockKeyedApi`), and the browser steps to its form."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from service.testing import MockKeyedApi, MockOAuthProvider, ScriptedBrowser

from .conftest import Deployment, deploy, write_catalog

KEYED = "keyed"  # the credential entry's name in the test catalog


@contextlib.asynccontextmanager
async def keyed_deployment(
    env: dict[str, str],
    tmp_path: Path,
    provider: MockOAuthProvider,
    keyed: MockKeyedApi,
    sock: socket.socket,
    **overrides: str,
) -> AsyncIterator[Deployment]:
    """A connector whose catalog holds the OAuth mock (`github`) and the keyed API (`keyed`), both over HTTP on
    loopback (so a real browser and the check request reach them)."""
    async with provider.serve_http(), keyed.serve_http():
        catalog = write_catalog(
            tmp_path / "keyed_providers.toml", {"github": provider.catalog_entry(), KEYED: keyed.catalog_entry()}
        )
        async with deploy(
            env, tmp_path, provider, sock, None, CONNECTOR_PROVIDERS__CATALOG=str(catalog), **overrides
        ) as deployment:
            yield deployment


async def to_form(browser: ScriptedBrowser, connect_url: str) -> httpx.Response:
    """Open the link, press Continue (the local verifier knows the user at once): the credential form."""
    page = await browser.get(connect_url)
    assert page.status_code == 200, page.text
    sent = await browser.submit(page, "continue")
    assert sent.status_code == 303, sent.text
    form = await browser.get(sent.headers["location"])
    assert form.status_code == 200, form.text
    return form


async def type_key(browser: ScriptedBrowser, form: httpx.Response, key: str) -> httpx.Response:
    """Submit the form with `key` typed in its field."""
    return await browser.submit(form, "", api_key=key)


@pytest.fixture
async def keyed_connector(
    connector_env: dict[str, str],
    tmp_path: Path,
    mock_provider: MockOAuthProvider,
    keyed: MockKeyedApi,
    loopback_socket: socket.socket,
) -> AsyncIterator[Deployment]:
    """A deployment whose catalog has the credential entry at `keyed`."""
    async with keyed_deployment(connector_env, tmp_path, mock_provider, keyed, loopback_socket) as running:
        yield running
