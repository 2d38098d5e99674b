"""The connector's pytest plugin, for testing an agent that uses the connector: `pip install
'acp-oauth-connector[testing]'` registers it (entry point `pytest11`), nothing to import.

Fixtures (all function-scoped; async ones need pytest-asyncio, installed with the extra):

- `oauth_provider`: a `MockOAuthProvider` served over HTTP on loopback. Configure it per test with
  `@pytest.mark.oauth_provider(expires_in=60, rotate_refresh_tokens=False, token_errors=["invalid_grant"],
  response_delay=0.5, deny_next="access_denied", repos=[...])` (any `MockOAuthProvider` field), or for a whole
  module by overriding the `oauth_provider_options` fixture. Its catalog name is `oauth_provider_name` ("github").
  `like="slack"` (any entry of the shipped catalog) makes it an `EmulatedProvider` of that entry, quirks and all;
  its catalog name is then that entry's name.
- `connector_user`: the `Identity` the connector's local verifier vouches for; bind authorizations to it.
- `agent_env`: the `CONNECTOR_*` environment of a connector bound to that provider: a migrated SQLite database and
  a key in `tmp_path`, the catalog entry and its credentials, a free loopback port. Pass it to an agent you spawn
  (`service.testing.spawn_agent(..., env=agent_env)`) that builds its connector from the environment.
- `connector`: a started `Connector` built from `agent_env` in this process, its pages served on loopback.
- `scripted_client`: a `ScriptedClient` (the official ACP SDK's client side) that accepts every elicitation.
- `scripted_browser`: a `ScriptedBrowser` (httpx) to open connect links and go through the provider.
- `chromium`: a Playwright `Browser` on the system's Chromium (`$ACP_CONNECTOR_CHROMIUM`, else /usr/bin/chromium);
  the test is skipped when Playwright or Chromium is missing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from service.bootstrap import generate_key, migrate_database
from service.config import load_settings
from service.connector import Connector
from service.core.identity import Identity
from service.web.server import listening_socket, serving

from .acp_client import ScriptedClient
from .browser import ScriptedBrowser
from .mock_like import EmulatedProvider
from .mock_provider import MockOAuthProvider
from .toml_text import toml_table

try:
    import pytest_asyncio
except ImportError as exc:  # pragma: no cover - the [testing] extra installs it
    raise ImportError(
        "the acp-oauth-connector pytest plugin needs pytest-asyncio: pip install 'acp-oauth-connector[testing]'"
    ) from exc

CHROMIUM_ENV = "ACP_CONNECTOR_CHROMIUM"
CHROMIUM_DEFAULT = "/usr/bin/chromium"
TEST_USER = Identity("https://users.example.test", "test-user")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "oauth_provider(**options): MockOAuthProvider fields for this test's mock provider"
    )


@pytest.fixture
def oauth_provider_options() -> dict[str, Any]:
    """MockOAuthProvider fields for every test in scope; override it in a conftest.py or module to change them."""
    return {}


@pytest.fixture
def oauth_provider_name(request: pytest.FixtureRequest, oauth_provider_options: dict[str, Any]) -> str:
    """The catalog name the mock provider is configured under (the `provider` an agent asks for): the emulated
    entry's with `like=NAME`, else "github"."""
    marker = request.node.get_closest_marker("oauth_provider")
    like = {**oauth_provider_options, **(marker.kwargs if marker is not None else {})}.get("like")
    return str(like) if like else "github"


@pytest.fixture
def connector_user() -> Identity:
    """The user the connector's local verifier vouches for: bind authorizations to it."""
    return TEST_USER


@pytest_asyncio.fixture
async def oauth_provider(
    request: pytest.FixtureRequest, oauth_provider_options: dict[str, Any]
) -> AsyncIterator[MockOAuthProvider]:
    """A MockOAuthProvider served on loopback; `@pytest.mark.oauth_provider(**fields)` configures it
    (`like="NAME"`: an `EmulatedProvider` of the shipped catalog's entry NAME)."""
    marker = request.node.get_closest_marker("oauth_provider")
    options = {**oauth_provider_options, **(marker.kwargs if marker is not None else {})}
    like = options.pop("like", None)
    provider = EmulatedProvider.like(like, **options) if like else MockOAuthProvider(**options)
    async with provider.serve_http():
        yield provider


def _free_port() -> int:
    with listening_socket("127.0.0.1", 0) as sock:
        return int(sock.getsockname()[1])


def connector_environment(
    directory: Path, provider: MockOAuthProvider, name: str, user: Identity, port: int
) -> dict[str, str]:
    """The `CONNECTOR_*` environment of a connector in `directory` bound to `provider` (catalog name `name`), its
    local verifier vouching for `user`, serving on 127.0.0.1:`port`; the database migrated."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "connector.toml"
    config.write_text("# every setting comes from the CONNECTOR_* environment in these tests\n")
    catalog = directory / "providers.toml"
    catalog.write_text(toml_table(name, provider.catalog_entry()))
    prefix = f"CONNECTOR_PROVIDER_{name.upper().replace('-', '_')}"
    env = {
        "CONNECTOR_CONFIG": str(config),
        "CONNECTOR_PUBLIC_BASE_URL": f"http://127.0.0.1:{port}",
        "CONNECTOR_SERVER__HOST": "127.0.0.1",
        "CONNECTOR_SERVER__PORT": str(port),
        "CONNECTOR_DATABASE__URL": f"sqlite+aiosqlite:///{directory / 'connector.db'}",
        "CONNECTOR_VAULT__KEYS": generate_key("test"),
        "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
        "CONNECTOR_IDENTITY__VERIFIER": "local",
        "CONNECTOR_IDENTITY__LOCAL__ISSUER": user.issuer,
        "CONNECTOR_IDENTITY__LOCAL__SUBJECT": user.subject,
        f"{prefix}_CLIENT_ID": provider.client_id,
        f"{prefix}_CLIENT_SECRET": provider.client_secret,
    }
    migrate_database(env["CONNECTOR_DATABASE__URL"])
    return env


@pytest.fixture
def agent_env(
    tmp_path: Path, oauth_provider: MockOAuthProvider, oauth_provider_name: str, connector_user: Identity
) -> dict[str, str]:
    return connector_environment(
        tmp_path / "connector", oauth_provider, oauth_provider_name, connector_user, _free_port()
    )


@pytest_asyncio.fixture
async def connector(
    tmp_path: Path, oauth_provider: MockOAuthProvider, oauth_provider_name: str, connector_user: Identity
) -> AsyncIterator[Connector]:
    """A started Connector bound to `oauth_provider`, its pages served on loopback (`connector.settings`)."""
    with listening_socket("127.0.0.1", 0) as sock:
        port = int(sock.getsockname()[1])
        env = connector_environment(tmp_path / "connector", oauth_provider, oauth_provider_name, connector_user, port)
        built = Connector.from_settings(load_settings(env["CONNECTOR_CONFIG"], env=env))
        try:
            await built.start()
            async with serving(built.asgi_app(), sock):
                yield built
        finally:
            await built.close()


@pytest.fixture
def scripted_client() -> ScriptedClient:
    """An ACP client (SDK client side) that accepts every elicitation; build your own for other answers."""
    return ScriptedClient("accept")


@pytest_asyncio.fixture
async def scripted_browser() -> AsyncIterator[ScriptedBrowser]:
    """The user's browser, scripted: `await scripted_browser.authorize(url)` goes through the whole flow."""
    async with ScriptedBrowser() as browser:
        yield browser


@pytest_asyncio.fixture
async def chromium() -> AsyncIterator[Any]:
    """A Playwright Browser on the system's Chromium; skips the test when Playwright or Chromium is missing."""
    executable = os.environ.get(CHROMIUM_ENV) or CHROMIUM_DEFAULT
    if shutil.which(executable) is None:
        pytest.skip(f"no Chromium at {executable} (set {CHROMIUM_ENV})")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.skip("Playwright is not installed (pip install playwright; its own browsers are not needed)")
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=executable, args=["--headless", "--no-sandbox"])
        try:
            yield browser
        finally:
            await browser.close()
