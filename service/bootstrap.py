"""Getting a deployment ready: its database schema and, for development, a token-encryption key.

The same steps `acp-connector migrate` and `acp-connector serve` take, for agents that embed the connector and for
their tests (`service.testing`'s pytest plugin uses them).
"""

from __future__ import annotations

import logging
from pathlib import Path

from .config import Settings
from .core.errors import ConfigError
from .store import migrate
from .vault import ensure_dev_key_file, generate_key

log = logging.getLogger("service.keys")

DEVELOPMENT_KEY_FILE = Path("var/vault.keys")

__all__ = ["DEVELOPMENT_KEY_FILE", "generate_key", "migrate_database", "use_development_key"]


def migrate_database(settings: Settings | str) -> tuple[str, ...]:
    """Upgrade the database of `settings` (or at this SQLAlchemy URL) to this version's schema, creating a SQLite
    file and its folder if needed; returns the revisions it was at before (empty for a new database). Safe to call
    again; raises DatabaseUnavailable when it cannot be reached."""
    return migrate(settings if isinstance(settings, str) else settings.database.url)


def use_development_key(settings: Settings, path: Path = DEVELOPMENT_KEY_FILE) -> Settings:
    """`settings` with a token-encryption key: unchanged when one is configured, else (on a loopback deployment
    only) a development key file at `vault.key_file` or `path`, created once with mode 0600.

    Raises ConfigError off loopback: a real deployment needs a managed key (`CONNECTOR_VAULT__KEYS` or a
    secret-mounted key file), never one made up at start.
    """
    if settings.vault.keys:
        return settings
    configured = settings.vault.key_file
    if configured is not None and configured.exists():
        return settings
    if not settings.is_loopback_deployment:
        raise ConfigError(
            str(settings.config_file or "environment"),
            "vault.key_file" if configured is not None else "vault.keys",
            "no token-encryption key is available and this is not a loopback deployment: run "
            "`acp-connector keys generate` and set CONNECTOR_VAULT__KEYS or point vault.key_file at a key file",
        )
    chosen = configured or path
    if ensure_dev_key_file(chosen):
        log.warning(
            "created a development key file at %s (mode 0600). Use a managed key (CONNECTOR_VAULT__KEYS or a "
            "secret-mounted key file) in any real deployment.",
            chosen,
        )
    return settings.model_copy(update={"vault": settings.vault.model_copy(update={"key_file": chosen})})
