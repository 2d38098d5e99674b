"""Legacy grants migrated across processes sharing one database (SQLite file and PostgreSQL): `acp-connector grants
migrate`, a separate process, killed with SIGKILL half way and run again while a connector in this process uses some
of the same grants; and two replica processes using one legacy grant at once. Each legacy token ends exchanged for
one pair (an exchange cut short by the kill is retried with the same token and answered the same pair), other
grants are untouched, and no grant is exchanged twice by two processes racing.

The provider is the mock of the shipped `[shopify]` entry, served over loopback HTTP (every process reaches it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from service import Connector, Identity, load_settings
from service.core.records import GrantRecord, TokenSet
from service.providers import provider_env_var
from service.store import Store, migrate
from service.testing import MockOAuthProvider
from service.testing.mock_like import EmulatedProvider
from service.testing.toml_text import toml_table
from service.vault import KeyRing, Vault, generate_key

from .conftest import fresh_postgres_database
from .migration_support import legacy_tokens, seed_grant, stored_set
from .test_replicas import run_replicas

REPO = Path(__file__).resolve().parents[1]
CLI = (sys.executable, "-m", "service.cli")
ISSUER = "https://login.example.com"
LEGACY = 40
OTHERS = 8
KEY = generate_key("k1")


@dataclass
class Setup:
    store: Store
    vault: Vault
    mock: EmulatedProvider
    env: dict[str, str]  # the CONNECTOR_* settings every process shares
    tmp: Path


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def setup(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Setup]:
    mock = EmulatedProvider.like("shopify", refresh_delay=0.02)  # each exchange's answer leaves 20 ms late
    other = MockOAuthProvider()  # a provider without legacy_token_exchange: never called
    async with mock.serve_http(), _database(request.param, tmp_path) as database_url:
        catalog = tmp_path / "providers.toml"
        catalog.write_text(toml_table("shopify", mock.catalog_entry()) + toml_table("github", other.catalog_entry()))
        env = {
            "CONNECTOR_DATABASE__URL": database_url,
            "CONNECTOR_VAULT__KEYS": KEY,
            "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
            provider_env_var("shopify", "CLIENT_ID"): mock.client_id,
            provider_env_var("shopify", "CLIENT_SECRET"): mock.client_secret,
            provider_env_var("github", "CLIENT_ID"): other.client_id,
            provider_env_var("github", "CLIENT_SECRET"): other.client_secret,
        }
        migrate(database_url)
        store = Store.from_url(database_url)
        try:
            yield Setup(store, Vault(KeyRing.from_strings([KEY])), mock, env, tmp_path)
        finally:
            await store.close()


@asynccontextmanager
async def _database(kind: str, tmp_path: Path) -> AsyncIterator[str]:
    if kind == "postgres":
        async with fresh_postgres_database(migrated=True) as url:
            yield url
    else:
        yield f"sqlite+aiosqlite:///{tmp_path / 'connector.db'}"


def user(number: int) -> Identity:
    return Identity(ISSUER, f"user-{number}")


async def seed(setup: Setup) -> tuple[dict[str, str], dict[str, bytes]]:
    """`LEGACY` legacy Shopify grants ({grant id: its token}), and grants that are not to be touched ({id: their
    ciphertext}): legacy-shaped ones at a provider without a migration, expiring Shopify ones."""
    legacy: dict[str, str] = {}
    untouched: dict[str, bytes] = {}
    for number in range(LEGACY):
        token = setup.mock.issue_legacy_token(scope="read_products")
        grant = await seed_grant(setup.store, setup.vault, user(number), "shopify", legacy_tokens(token))
        legacy[grant.id] = token
    for number in range(OTHERS):
        other = legacy_tokens(f"gho_legacy_{number:04d}", connection={})
        grant = await seed_grant(setup.store, setup.vault, user(number), "github", other)
        untouched[grant.id] = grant.token_ciphertext
        expiring = TokenSet(
            access_token=f"shpat_{number:04d}",
            token_type="bearer",
            refresh_token=f"shprt_{number:04d}",
            expires_at=(datetime.now(UTC) + timedelta(hours=1)).timestamp(),
            scopes=("read_products",),
            connection={"subdomain": "acme"},
        )
        grant = await seed_grant(setup.store, setup.vault, user(LEGACY + number), "shopify", expiring)
        untouched[grant.id] = grant.token_ciphertext
    return legacy, untouched


async def grants_of(setup: Setup) -> dict[str, GrantRecord]:
    return {grant.id: grant for grant in await setup.store.grants.not_under("", limit=10_000)}


def process_env(setup: Setup) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
    return {**env, **setup.env, "PYTHONPATH": str(REPO)}


async def migrate_command(setup: Setup, *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *CLI, "grants", "migrate", *args, cwd=setup.tmp, env=process_env(setup), stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(process.communicate(), 300)
    assert process.returncode is not None
    return process.returncode, err.decode()


async def connector_here(setup: Setup) -> Connector:
    """A connector in this process on the same database: a replica serving while the command runs."""
    config = setup.tmp / "connector.toml"
    config.write_text("# every setting comes from the environment\n")
    settings = load_settings(config, env={**setup.env, "CONNECTOR_PUBLIC_BASE_URL": "http://127.0.0.1:9"})
    connector = Connector.from_settings(settings)
    await connector.start()
    return connector


@pytest.mark.duration(15)
async def test_the_command_killed_half_way_and_run_again_migrates_every_legacy_grant_once(setup: Setup) -> None:
    legacy, untouched = await seed(setup)
    mock = setup.mock
    connector = await connector_here(setup)
    try:
        running = await asyncio.create_subprocess_exec(
            *CLI,
            "grants",
            "migrate",
            "--batch-size",
            "4",
            "--pause",
            "0.05",
            cwd=setup.tmp,
            env=process_env(setup),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )

        async def use(number: int) -> int:  # a replica serving users 0-9 meanwhile
            async with connector.http(user(number), "shopify") as api:
                return (await api.get("probe")).status_code

        try:
            uses = asyncio.gather(*(use(number) for number in range(10)))
            for _ in range(3000):
                migrated = sum(g.token_expires_at is not None for g in (await grants_of(setup)).values())
                if migrated >= LEGACY // 3 + OTHERS or running.returncode is not None:
                    break
                await asyncio.sleep(0.01)
            assert running.returncode is None, "the command finished before it could be killed"
            running.send_signal(signal.SIGKILL)
            assert await uses == [200] * 10
        finally:
            if running.returncode is None:
                running.kill()
            await running.wait()
        assert running.returncode == -signal.SIGKILL
        half = await grants_of(setup)
        assert 0 < sum(half[g].token_expires_at is not None for g in legacy) < LEGACY

        code, err = await migrate_command(setup, "--batch-size", "7")
        assert code == 0, err
        assert "legacy grants migrated at shopify; 0 need the user, 0 failed for now, 0 do not decrypt" in err
    finally:
        await connector.close()

    after = await grants_of(setup)
    for grant_id, old in legacy.items():
        tokens = stored_set(after[grant_id], setup.vault)
        answer = mock.legacy.migrated[old].answer  # the one pair this token was exchanged for
        assert (tokens["access_token"], tokens["refresh_token"]) == (answer["access_token"], answer["refresh_token"])
        assert after[grant_id].token_expires_at is not None
    assert set(mock.legacy.exchanges) == set(legacy.values())
    # Each token exchanged once, but for at most one whose exchange the kill cut short (retried: the same pair).
    assert sum(count - 1 for count in mock.legacy.exchanges.values()) <= 1
    assert {grant_id: after[grant_id].token_ciphertext for grant_id in untouched} == untouched
    (summary,) = await setup.store.audit.list(event="grants_migrated")
    assert summary.detail["providers"] == ["shopify"] and summary.detail["needs_user"] == 0


async def test_the_command_names_what_it_could_not_migrate(setup: Setup) -> None:
    mock = setup.mock
    tokens = [mock.issue_legacy_token(scope="read_products") for _ in range(3)]
    grants = [
        await seed_grant(setup.store, setup.vault, user(n), "shopify", legacy_tokens(token))
        for n, token in enumerate(tokens)
    ]
    mock._access.discard(tokens[1])  # that shop uninstalled the app: its exchange is refused
    code, err = await migrate_command(setup)
    assert code == 1, err
    assert "2 legacy grants migrated at shopify; 1 need the user" in err
    assert f"some legacy grants were not migrated: 1 need the user (first: {grants[1].id})" in err
    assert "Traceback" not in err
    for secret in [*tokens, mock.client_secret, *mock.issued_access_tokens, *mock.issued_refresh_tokens]:
        assert secret not in err
    refused = await setup.store.grants.get(grants[1].id)
    assert refused is not None and refused.health.needs_user

    code, err = await migrate_command(setup, "--provider", "github")
    assert code == 2 and "provider 'github' has no legacy_token_exchange" in err


@pytest.mark.duration(12)
async def test_two_replicas_using_one_legacy_grant_at_once_exchange_it_once(setup: Setup) -> None:
    mock = setup.mock
    mock.refresh_delay = 0.3  # a long exchange: both replicas want the grant while it is in flight
    token = mock.issue_legacy_token(scope="read_products")
    grant = await seed_grant(setup.store, setup.vault, user(0), "shopify", legacy_tokens(token))
    config = setup.tmp / "connector.toml"
    config.write_text("# every setting comes from the environment\n")
    env = {**process_env(setup), "CONNECTOR_CONFIG": str(config)}
    results = await run_replicas(env, 2, 20, user(0), "shopify")
    assert results == [{"statuses": {"200": 20}, "errors": {}}] * 2
    assert mock.legacy.exchanges == {token: 1}
    stored = await setup.store.grants.get(grant.id)
    assert stored is not None
    assert stored_set(stored, setup.vault)["refresh_token"] == mock.legacy.migrated[token].answer["refresh_token"]
    assert len(await setup.store.audit.list(event="token_migrated")) == 1
