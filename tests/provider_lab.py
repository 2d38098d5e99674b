"""One connector (SQLite, real loopback server) bound to a mock of every catalog entry, for the provider tests.

Each catalog entry gets an `EmulatedProvider` built from its providers.toml table (its URLs moved onto
`https://<name>.mock-provider.test`, reached through one respx router); the connector's catalog is those tables.
`ProviderLab.connect` runs an authorization over the `/v1` API and a scripted browser, then the grant is used through
`Connector.http()` and `/v1/proxy`, refreshed and revoked by the tests.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import respx
from joserfc.jwk import RSAKey

from service import Connector, Identity, load_settings
from service.providers import ProviderEntry, load_catalog, provider_env_var
from service.store import migrate
from service.testing import ScriptedBrowser
from service.testing.mock_like import CATALOG, EmulatedProvider
from service.testing.toml_text import toml_table
from service.vault import generate_key
from service.web.server import listening_socket, serving

from .api_support import make_key

USER = Identity("https://login.example.com", "alice")


def catalog_names() -> list[str]:
    """Every OAuth entry of the shipped catalog (credential entries: tests/test_credential_entries.py)."""
    return [entry.name for entry in load_catalog(CATALOG, env={}).entries() if not entry.is_credential]


@dataclass
class Connected:
    """What an authorization over the API ended with."""

    status: int  # the browser's last page
    state: dict[str, Any]  # GET /v1/elicitations/{id}
    page: httpx.Response

    @property
    def grant(self) -> dict[str, Any] | None:
        grant: dict[str, Any] | None = self.state.get("grant")
        return grant


@dataclass
class ProviderLab:
    connector: Connector
    base_url: str
    mocks: dict[str, EmulatedProvider]
    key: str

    def entry(self, name: str) -> ProviderEntry:
        return self.connector.runtime.providers.entry(name)

    def api(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, headers={"Authorization": f"Bearer {self.key}"}, timeout=30)

    def agent_values(self, name: str) -> dict[str, str]:
        """An example of each per-connection value the entry asks of the agent (without a default)."""
        entry = self.entry(name)
        return {value.name: value.example for value in entry.quirks.values_from("agent") if value.default is None}

    async def create(
        self, name: str, *, connection: Mapping[str, str] | None = None, scopes: Sequence[str] | None = None
    ) -> httpx.Response:
        body: dict[str, Any] = {
            "user": {"issuer": USER.issuer, "subject": USER.subject},
            "provider": name,
            "scope": {"sessionId": "sess-1"},
            "askAgain": True,
        }
        if scopes is not None:
            body["scopes"] = list(scopes)
        if connection:
            body["connection"] = dict(connection)
        async with self.api() as api:
            return await api.post("/v1/elicitations", json=body)

    async def connect(
        self, name: str, *, connection: Mapping[str, str] | None = None, scopes: Sequence[str] | None = None
    ) -> Connected:
        """An authorization at `name` through the API and a scripted browser, as far as it goes."""
        values = self.agent_values(name) if connection is None else connection
        created = await self.create(name, connection=values, scopes=scopes)
        assert created.status_code == 201, created.text
        eid = created.json()["elicitationId"]
        async with self.api() as api:
            accepted = await api.post(f"/v1/elicitations/{eid}/answer", json={"action": "accept"})
            assert accepted.status_code == 200, accepted.text
            async with ScriptedBrowser() as browser:
                page = await browser.authorize(created.json()["url"])
            state = (await api.get(f"/v1/elicitations/{eid}")).json()
        return Connected(page.status_code, state, page)

    async def proxy(self, name: str, path: str, method: str = "GET") -> httpx.Response:
        headers = {"Connector-User-Issuer": USER.issuer, "Connector-User-Subject": USER.subject}
        async with self.api() as api:
            return await api.request(method, f"/v1/proxy/{name}/{path}", headers=headers)

    async def use(self, name: str, path: str) -> httpx.Response:
        """A GET through `Connector.http()` (the embedded API)."""
        async with self.connector.http(USER, name) as client:
            return await client.get(path)

    async def disconnect(self, grant_id: str) -> httpx.Response:
        async with self.api() as api:
            return await api.delete(f"/v1/grants/{grant_id}")


def _environment(tmp: Path, mocks: Mapping[str, EmulatedProvider], port: int) -> dict[str, str]:
    catalog = tmp / "providers.toml"
    catalog.write_text("\n".join(toml_table(name, mock.catalog_entry()) for name, mock in mocks.items()))
    env = {
        "CONNECTOR_PUBLIC_BASE_URL": f"http://127.0.0.1:{port}",
        "CONNECTOR_SERVER__PORT": str(port),
        "CONNECTOR_DATABASE__URL": f"sqlite+aiosqlite:///{tmp / 'connector.db'}",
        "CONNECTOR_VAULT__KEYS": generate_key("k1"),
        "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
        "CONNECTOR_IDENTITY__LOCAL__ISSUER": USER.issuer,
        "CONNECTOR_IDENTITY__LOCAL__SUBJECT": USER.subject,
        "CONNECTOR_RATE_LIMIT__ENABLED": "false",  # one loopback client runs every provider's flow
        # Authorized through agent-a's key, used through the embedded API too (`use`): the two share grants.
        "CONNECTOR_TENANTS__SHARED_GROUPS": "embedded+agent-a",
    }
    for name, mock in mocks.items():
        env[provider_env_var(name, "CLIENT_ID")] = mock.client_id
        env[provider_env_var(name, "CLIENT_SECRET")] = mock.client_secret
    return env


@asynccontextmanager
async def provider_lab(tmp: Path, names: Sequence[str]) -> AsyncIterator[ProviderLab]:
    """A started connector bound to a mock of each of `names`, served on loopback, with an API key for all."""
    key = RSAKey.generate_key(2048, parameters={"kid": "lab-key", "use": "sig", "alg": "RS256"})
    mocks = {name: EmulatedProvider.like(name, signing_key=key) for name in names}
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        router.route(host="127.0.0.1").pass_through()
        for mock in mocks.values():
            mock.install(router)
        sock: socket.socket
        with listening_socket("127.0.0.1", 0) as sock:
            env = _environment(tmp, mocks, sock.getsockname()[1])
            config = tmp / "connector.toml"
            config.write_text("# every setting comes from the environment in these tests\n")
            settings = load_settings(config, env=env)
            migrate(settings.database.url)
            connector = Connector.from_settings(settings)
            await connector.start()
            try:
                async with serving(connector.asgi_app(), sock):
                    key = await make_key(connector.runtime.store, "agent-a")
                    yield ProviderLab(connector, settings.public_base_url, mocks, key)
            finally:
                await connector.close()
