"""`acp-connector serve`: the web service (connect pages, provider callbacks, health)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ..config import Settings
from ..core.errors import ConfigError
from ..vault import ensure_dev_key_file
from .framework import Commands, Invocation

DEV_KEY_FILE = Path("var/vault.keys")


def register(commands: Commands) -> None:
    commands.command(
        "serve",
        run,
        help="run the web service (connect pages, provider callbacks, health)",
        description=(
            "Serve the connector's web routes on server.host:server.port until interrupted: the connect pages\n"
            "users open from an agent's link, the OAuth callbacks, /healthz and /readyz.\n\n"
            "The database must be migrated first (`acp-connector migrate`). On a loopback deployment without a\n"
            "token-encryption key, a development key file is created at var/vault.keys (mode 0600)."
        ),
        examples=["acp-connector migrate && acp-connector serve", "acp-connector serve --config /etc/connector.toml"],
    )


def run(invocation: Invocation) -> int:
    settings = with_dev_key(invocation, invocation.settings())
    return asyncio.run(_serve(invocation, settings))


async def _serve(invocation: Invocation, settings: Settings) -> int:
    from ..connector import Connector

    connector = Connector.from_settings(settings)
    try:
        await connector.start()
        invocation.note(f"serving on {settings.public_base_url} (connect pages at /connect/<id>)")
        await connector.serve()
    finally:
        await connector.close()
    return 0


def with_dev_key(invocation: Invocation, settings: Settings) -> Settings:
    """On a loopback deployment without a key, create a development key file (0600) and use it."""
    if settings.vault.keys:
        return settings
    path = settings.vault.key_file
    if path is not None and path.exists():
        return settings
    if not settings.is_loopback_deployment:
        raise ConfigError(
            str(settings.config_file or "environment"),
            "vault.key_file" if path is not None else "vault.keys",
            "no token-encryption key is available and this is not a loopback deployment: run "
            "`acp-connector keys generate` and set CONNECTOR_VAULT__KEYS or point vault.key_file at a key file",
        )
    path = path or DEV_KEY_FILE
    if ensure_dev_key_file(path):
        invocation.note(
            f"created a development key file at {path} (mode 0600). "
            "Use a managed key (CONNECTOR_VAULT__KEYS or a secret-mounted key file) in any real deployment."
        )
    return settings.model_copy(update={"vault": settings.vault.model_copy(update={"key_file": path})})
