"""The `acp-connector` command: serve | migrate | providers list | keys generate | mock-provider."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path

from .config import Settings, load_settings
from .core.errors import ConfigError, ConnectorError, SchemaNotCurrent, VaultError
from .logs import configure
from .providers import load_catalog
from .store import display_url, migrate
from .vault import ensure_dev_key_file, generate_key

log = logging.getLogger("service.cli")

DEV_KEY_FILE = Path("var/vault.keys")
EXIT_CONFIG = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="acp-connector", description=__doc__)
    parser.add_argument("--config", help="connector TOML file (default: $CONNECTOR_CONFIG or config/connector.toml)")
    parser.add_argument("--log-format", choices=["text", "json"], help="override log_format from the config")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the web service (connect pages, callbacks, health)")
    sub.add_parser("migrate", help="apply database migrations")
    providers = sub.add_parser("providers", help="the provider catalog")
    providers_sub = providers.add_subparsers(dest="providers_command", required=True)
    providers_sub.add_parser("list", help="list providers and whether each is configured")
    keys = sub.add_parser("keys", help="token-encryption keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    generate = keys_sub.add_parser("generate", help="print a new key as KID:BASE64URL")
    generate.add_argument("--key-id", help="key id to use (default: k-YYYYMMDD-xxxx)")
    mock = sub.add_parser("mock-provider", help="serve a mock OAuth provider on loopback, for testing agents")
    mock.add_argument("--host", default="127.0.0.1", help="loopback address to listen on (default: 127.0.0.1)")
    mock.add_argument("--port", type=int, default=8701, help="port to listen on, 0 for any free port (default: 8701)")
    mock.add_argument("--name", default="github", help="catalog name whose credentials it accepts (default: github)")
    return parser


def _fail(message: str, code: int = EXIT_CONFIG) -> int:
    print(f"acp-connector: {message}", file=sys.stderr)
    return code


def _with_dev_key(settings: Settings) -> Settings:
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
        print(
            f"acp-connector: created a development key file at {path} (mode 0600). "
            "Use a managed key (CONNECTOR_VAULT__KEYS or a secret-mounted key file) in any real deployment.",
            file=sys.stderr,
        )
    return settings.model_copy(update={"vault": settings.vault.model_copy(update={"key_file": path})})


async def _serve(settings: Settings) -> int:
    from .connector import Connector

    connector = Connector.from_settings(settings)
    try:
        await connector.start()
    except SchemaNotCurrent as exc:
        await connector.close()
        return _fail(str(exc))
    print(
        f"acp-connector: serving on {settings.public_base_url} (connect pages at /connect/<id>)",
        file=sys.stderr,
    )
    try:
        await connector.serve()
    finally:
        await connector.close()
    return 0


def _providers_list(settings: Settings) -> int:
    catalog = load_catalog(settings.providers.catalog)
    base = settings.public_base_url
    rows = [("NAME", "PROVIDER", "AUTHORIZATION HOST", "REDIRECT URI", "STATUS")]
    for entry in catalog.entries():
        if entry.configured:
            status = "configured"
        elif not entry.has_credentials:
            status = f"unconfigured: set {entry.client_id_env_var} and {entry.client_secret_env_var}"
        else:
            status = "unconfigured: no endpoints (set the discovery URL)"
        host = entry.provider_host or "-"
        rows.append((entry.name, entry.display_name, host, f"{base}/callback/{entry.name}", status))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def _mock_provider(host: str, port: int, name: str) -> int:
    """Serve `MockOAuthProvider` on loopback; it accepts the client credentials the connector is configured with."""
    from .providers import provider_env_var
    from .testing.mock_provider import MockOAuthProvider

    id_var, secret_var = provider_env_var(name, "CLIENT_ID"), provider_env_var(name, "CLIENT_SECRET")
    client_id, client_secret = os.environ.get(id_var), os.environ.get(secret_var)
    if not client_id or not client_secret:
        return _fail(f"mock-provider: set {id_var} and {secret_var} (any values; the agent's connector uses the same)")
    provider = MockOAuthProvider(client_id=client_id, client_secret=client_secret)

    def ready(base_url: str) -> None:
        entry = "\n".join(f"{key} = {json.dumps(value)}" for key, value in provider.catalog_entry().items())
        print(f"# mock OAuth provider at {base_url}; a providers.toml entry for it:\n[{name}]\n{entry}", flush=True)

    try:
        asyncio.run(provider.serve_forever(host, port, on_ready=ready))
    except (ValueError, OSError) as exc:
        return _fail(f"mock-provider: {exc}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "keys":
        print(generate_key(args.key_id))
        return 0
    if args.command == "mock-provider":
        configure(args.log_format or "text")
        try:
            return _mock_provider(args.host, args.port, args.name)
        except KeyboardInterrupt:
            return 130
    try:
        settings = load_settings(args.config)
        configure(args.log_format or settings.log_format)
        if args.command == "migrate":
            migrate(settings.database.url)
            print(
                f"acp-connector: database at {display_url(settings.database.url)} is up to date",
                file=sys.stderr,
            )
            return 0
        if args.command == "providers":
            return _providers_list(settings)
        return asyncio.run(_serve(_with_dev_key(settings)))
    except ConfigError as exc:
        return _fail(f"config error: {exc}")
    except (VaultError, ConnectorError) as exc:
        return _fail(f"{exc.code}: {exc}")
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
