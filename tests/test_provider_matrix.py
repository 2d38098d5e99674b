"""Every catalog entry end to end against a mock emulating it: connect, use through `Connector.http()` and
`/v1/proxy`, refresh (where the provider has refresh tokens), revoke (where it has a revocation endpoint).

One connector and one set of mocks serve the whole module (SQLite, a real loopback server). Each mock is built from
the entry's own providers.toml table (`EmulatedProvider`), so breaking the connector's handling of one quirk (where
the token sits, the request encoding, the API header, the revocation style, a per-connection value) fails the
entries that have it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from .provider_lab import ProviderLab, catalog_names, provider_lab

NAMES = catalog_names()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lab(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ProviderLab]:
    async with provider_lab(Path(tmp_path_factory.mktemp("matrix")), NAMES) as running:
        yield running


def test_the_catalog_has_at_least_forty_entries() -> None:
    assert len(NAMES) >= 40, NAMES


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("name", NAMES)
async def test_connect_use_refresh_revoke(lab: ProviderLab, name: str) -> None:
    entry, mock = lab.entry(name), lab.mocks[name]
    probe = "user" if mock.discovered else "probe"

    connected = await lab.connect(name)
    assert connected.status == 200, connected.page.text
    assert connected.state["status"] == "completed", connected.state
    grant = connected.grant
    assert grant is not None
    expected_account = mock.account["sub"] if entry.oidc else mock.account_id
    assert grant["accountId"] == expected_account
    shown = {value.name for value in entry.quirks.connection if not value.secret}
    assert set(grant["connection"]) == shown  # every per-connection value is stored and shown

    used = await lab.use(name, probe)
    assert used.status_code == 200, used.text
    proxied = await lab.proxy(name, probe)
    assert proxied.status_code == 200, proxied.text

    if entry.quirks.token_request.refresh_tokens != "none":  # (without: tests/test_provider_quirks.py)
        mock.expire_access_tokens()
        refreshes = sum(1 for r in mock.token_requests if r["grant_type"] == "refresh_token")
        after = await lab.use(name, probe)
        assert after.status_code == 200, after.text
        assert sum(1 for r in mock.token_requests if r["grant_type"] == "refresh_token") == refreshes + 1
        assert (await lab.proxy(name, probe)).status_code == 200

    issued = mock.issued_access_tokens + mock.issued_refresh_tokens
    live = [token for token in issued if mock.token_active(token)]
    removed = await lab.disconnect(grant["grantId"])
    assert removed.status_code == 204, removed.text
    if entry.revocation_endpoint or mock.discovered:  # (the discovery document names one)
        assert mock.revocation_requests and mock.revocation_requests[-1]["client_auth"] != "failed"
        assert live and not any(mock.token_active(token) for token in live)
    else:
        assert not mock.revocation_requests
