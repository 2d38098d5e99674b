"""Agents as stdio subprocesses for the robustness tests: their configuration (a mock provider on loopback, SQLite)."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.store import migrate
from service.testing import MockOAuthProvider, ScriptedClient, spawn_agent
from service.testing.acp_client import SpawnedAgent
from service.vault import generate_key

from .conftest import ALICE, write_catalog

REPO = Path(__file__).resolve().parents[1]


@dataclass
class StdioSetup:
    env: dict[str, str]
    db_url: str


@pytest.fixture
async def stdio_setup(tmp_path: Path, unused_tcp_port: int) -> AsyncIterator[StdioSetup]:
    provider = MockOAuthProvider()
    async with provider.serve_http():
        config = tmp_path / "connector.toml"
        config.write_text("# everything comes from CONNECTOR_* variables in this test\n")
        db_url = f"sqlite+aiosqlite:///{tmp_path / 'connector.db'}"
        migrate(db_url)
        env = {
            "CONNECTOR_CONFIG": str(config),
            "CONNECTOR_PUBLIC_BASE_URL": f"http://127.0.0.1:{unused_tcp_port}",
            "CONNECTOR_SERVER__HOST": "127.0.0.1",
            "CONNECTOR_SERVER__PORT": str(unused_tcp_port),
            "CONNECTOR_DATABASE__URL": db_url,
            "CONNECTOR_VAULT__KEYS": generate_key("k1"),
            "CONNECTOR_PROVIDERS__CATALOG": str(
                write_catalog(tmp_path / "providers.toml", {"github": provider.catalog_entry()})
            ),
            "CONNECTOR_IDENTITY__LOCAL__ISSUER": ALICE.issuer,
            "CONNECTOR_IDENTITY__LOCAL__SUBJECT": ALICE.subject,
            "CONNECTOR_PROVIDER_GITHUB_CLIENT_ID": provider.client_id,
            "CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET": provider.client_secret,
            "PYTHONUNBUFFERED": "1",
            "PATH": os.environ.get("PATH", ""),
        }
        yield StdioSetup(env, db_url)


def spawn_test_agent(
    client: ScriptedClient, setup: StdioSetup, **env: str
) -> AbstractAsyncContextManager[SpawnedAgent]:
    """The connector's test agent (`tests/stdio_agent.py`) as a subprocess, `client` on its stdio."""
    return spawn_agent(client, sys.executable, "-m", "tests.stdio_agent", env={**setup.env, **env}, cwd=REPO)
