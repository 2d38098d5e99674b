"""Several connector processes on one PostgreSQL database: one refresh of an expired grant for all of them.

The replicas are real, separate processes (`tests/replica_worker.py`); the provider is the mock provider served
over loopback HTTP, rotating refresh tokens (an old one is refused once used) and counting every call.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from service.core.handles import grant_aad
from service.core.records import TokenSet
from service.testing import MockOAuthProvider
from service.vault import generate_key

from .conftest import ALICE, Deployment, deploy, fresh_postgres_database, write_catalog
from .test_tokens import authorize, refreshes

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[1]
USES_PER_REPLICA = 500


@dataclass
class Cluster:
    provider: MockOAuthProvider
    env: dict[str, str]  # the CONNECTOR_* settings every replica shares
    database_url: str


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    provider = MockOAuthProvider(refresh_delay=0.2)  # the rotation happens 0.2 s before the answer leaves
    async with provider.serve_http(), fresh_postgres_database() as database_url:
        catalog = write_catalog(tmp_path / "providers.toml", {"github": provider.catalog_entry()})
        config = tmp_path / "connector.toml"
        config.write_text("# every setting comes from CONNECTOR_* variables\n")
        env = {
            "CONNECTOR_CONFIG": str(config),
            "CONNECTOR_DATABASE__URL": database_url,
            "CONNECTOR_VAULT__KEYS": generate_key("k1"),
            "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
            "CONNECTOR_IDENTITY__LOCAL__ISSUER": ALICE.issuer,
            "CONNECTOR_IDENTITY__LOCAL__SUBJECT": ALICE.subject,
            "CONNECTOR_PROVIDER_GITHUB_CLIENT_ID": provider.client_id,
            "CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET": provider.client_secret,
        }
        yield Cluster(provider, env, database_url)


@pytest.fixture
async def seeded(cluster: Cluster, tmp_path: Path) -> AsyncIterator[Deployment]:
    """A connector in this process that ran the real flow once: Alice holds a GitHub grant."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        env = {
            **cluster.env,
            "CONNECTOR_PUBLIC_BASE_URL": f"http://127.0.0.1:{port}",
            "CONNECTOR_SERVER__PORT": str(port),
        }
        async with deploy(env, tmp_path, cluster.provider, sock) as deployment:
            await authorize(deployment)
            yield deployment


async def expire_stored_tokens(deployment: Deployment) -> TokenSet:
    """Make Alice's grant expired everywhere: its stored expiry is past and the provider refuses its token."""
    runtime = deployment.connector.runtime
    (grant,) = await runtime.store.grants.find(ALICE, "github")
    aad = grant_aad(ALICE.issuer, ALICE.subject, "github", grant.provider_account_id)
    tokens = TokenSet.from_json(runtime.vault.decrypt_json(grant.token_key_id, grant.token_ciphertext, aad=aad))
    past = datetime.now(UTC) - timedelta(minutes=5)
    expired = TokenSet.from_json({**tokens.to_json(), "expires_at": past.timestamp()})
    key_id, blob = runtime.vault.encrypt_json(expired.to_json(), aad=aad)
    await runtime.store.grants.update_tokens(
        grant.id, token_key_id=key_id, token_ciphertext=blob, token_expires_at=past, scopes=grant.scopes, now=past
    )
    deployment.provider.expire_access_tokens()
    return expired


async def run_replicas(env: dict[str, str], count: int, uses: int) -> list[dict[str, dict[str, int]]]:
    """Start `count` replica processes, let them all start using the grant at once, and collect their results."""
    process_env = {**os.environ, **env, "PYTHONPATH": str(REPO)}
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.replica_worker",
            str(uses),
            ALICE.issuer,
            ALICE.subject,
            cwd=REPO,
            env=process_env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(count)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert line.strip() == b"ready", line
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        outputs = await asyncio.wait_for(asyncio.gather(*(proc.communicate() for proc in procs)), 120)
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    results = []
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    return results


async def test_two_replicas_refresh_an_expired_grant_exactly_once(seeded: Deployment, cluster: Cluster) -> None:
    provider = cluster.provider
    before = await expire_stored_tokens(seeded)
    refreshes_before, calls_before = refreshes(seeded), len(provider.api_calls)

    results = await run_replicas(cluster.env, 2, USES_PER_REPLICA)

    # Exactly one refresh for both processes, no failures, and no request ever sent with a dead token: the
    # provider answered every first attempt (a 401 would have cost a retry, i.e. a second API call).
    assert refreshes(seeded) - refreshes_before == 1
    assert [r["errors"] for r in results] == [{}, {}]
    assert [r["statuses"] for r in results] == [{"200": USES_PER_REPLICA}] * 2
    assert len(provider.api_calls) - calls_before == 2 * USES_PER_REPLICA
    # The rotated refresh token is the one stored; the one it replaced is dead at the provider.
    runtime = seeded.connector.runtime
    (grant,) = await runtime.store.grants.find(ALICE, "github")
    stored = seeded.connector.runtime.tokens.decrypt(grant)
    assert stored.refresh_token == provider.issued_refresh_tokens[-1] != before.refresh_token
    assert stored.access_token == provider.issued_access_tokens[-1]
    events = [e.event for e in await runtime.store.audit.list() if e.event.startswith("refresh")]
    assert events == ["refreshed"]
