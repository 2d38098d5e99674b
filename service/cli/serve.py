"""`acp-connector serve`: the web service (connect pages, provider callbacks, health), optionally as a demo."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from .framework import CliError, Commands, Invocation, UsageError, port_number

if TYPE_CHECKING:
    from ..config import Settings

DEMO_CATALOG = Path("var/demo-providers.toml")
DEMO_PROVIDER = "demo"
DEMO_KEY_PROVIDER = "demo-key"  # the API-key demo: a mock API that takes an API key typed on the connector's page


def register(commands: Commands) -> None:
    serve = commands.command(
        "serve",
        run,
        help="run the web service (connect pages, provider callbacks, health)",
        description=(
            "Serve the connector's web routes on server.host:server.port until interrupted: the connect pages\n"
            "users open from an agent's link, the OAuth callbacks, /, /healthz and /readyz.\n\n"
            "The database must be migrated first (`acp-connector migrate`). On a loopback deployment without a\n"
            "token-encryption key, a development key file is created at var/vault.keys (mode 0600).\n\n"
            "--demo (what `make run` uses) turns on the demo: / offers a link that starts an authorization for\n"
            "the local user without an agent and, when no provider in the catalog has credentials, a mock\n"
            f"provider ('{DEMO_PROVIDER}') is served on a loopback port to sign in at. Loopback deployments only."
        ),
        examples=[
            "acp-connector migrate && acp-connector serve",
            "acp-connector serve --config /etc/connector.toml",
            "acp-connector serve --demo",
            "acp-connector serve --demo --port 8790",
        ],
    )
    serve.set_defaults(_serves=True)  # its audit lines are the service's log
    serve.add_argument("--host", help="address to listen on (default: server.host, 127.0.0.1)")
    serve.add_argument("--port", type=port_number(lowest=1), help="port to listen on (default: server.port, 8700)")
    serve.add_argument(
        "--demo",
        action="store_true",
        help="development demo on loopback: a start link on / and, without real providers, a mock provider",
    )


def run(invocation: Invocation) -> int:
    import asyncio

    from ..bootstrap import use_development_key

    args = invocation.args
    listener = {"CONNECTOR_SERVER__HOST": args.host, "CONNECTOR_SERVER__PORT": args.port}
    invocation.env = {**invocation.env, **{name: str(value) for name, value in listener.items() if value is not None}}
    settings = invocation.settings()
    if args.demo:
        return asyncio.run(_serve_demo(invocation, settings))
    return asyncio.run(_serve(invocation, use_development_key(settings)))


async def _serve(invocation: Invocation, settings: Settings, greeting: str | None = None) -> int:
    # The runtime, not the `Connector` facade: a server that holds no ACP connection never imports the ACP SDK.
    from ..app import build_runtime, serve_runtime
    from ..core.errors import PortUnavailable
    from ..util.heap import freeze_startup_objects

    def listening() -> None:
        freeze_startup_objects()  # started, routes built: nothing of that needs the collector's walks again
        invocation.note(f"serving on {settings.public_base_url} (connect pages at /connect/<id>)")
        if greeting:
            invocation.note(greeting)

    runtime = build_runtime(settings)
    try:
        await runtime.start()
        await serve_runtime(runtime, on_listening=listening)
    except PortUnavailable as exc:
        raise CliError(f"serve: {exc}", "stop what uses it, or choose another port: --port or server.port") from None
    finally:
        await runtime.close()
    return 0


async def _serve_demo(invocation: Invocation, settings: Settings) -> int:
    from ..bootstrap import use_development_key
    from ..providers import load_catalog

    if not settings.is_loopback_deployment:
        raise UsageError(
            f"serve --demo: this is not a loopback deployment (server.host '{settings.server.host}', "
            f"public_base_url {settings.public_base_url})",
            "serve the demo on 127.0.0.1 only, or drop --demo",
        )
    catalog = load_catalog(settings.providers.catalog, env=settings.environment())
    # Credential entries (API keys) need no set-up, so they do not count as a provider someone configured.
    oauth_ready = [entry.name for entry in catalog.entries() if entry.configured and not entry.is_credential]
    if oauth_ready:
        ready = ", ".join(oauth_ready)
        invocation.note(f"demo: using the configured provider(s) {ready}")
        demo = _reload(invocation, {"CONNECTOR_DEMO": "true"})
        return await _serve(invocation, use_development_key(demo))
    async with _demo_provider(settings) as (extra_env, demo_key):
        demo = _reload(invocation, {"CONNECTOR_DEMO": "true", **extra_env})
        greeting = (
            f"DEMO: no provider has credentials, so a mock provider ('{DEMO_PROVIDER}') serves on loopback. "
            f"Open {demo.public_base_url}/ and press “Start a demo authorization”. For the API-key demo "
            f"('{DEMO_KEY_PROVIDER}', a mock API on loopback) press “Start an API-key demo” and type the mock's "
            f"demo key {demo_key} (valid only for this mock, for this run)."
        )
        return await _serve(invocation, use_development_key(demo), greeting)


@asynccontextmanager
async def _demo_provider(settings: Settings) -> AsyncIterator[tuple[dict[str, str], str]]:
    """Serve the mock provider and the keyed mock API on loopback; yields the environment that adds them to the
    catalog, and the demo key the keyed API accepts."""
    import secrets

    from ..core.urls import is_loopback_host
    from ..providers import provider_env_var
    from ..testing.mock_keyed import MockKeyedApi
    from ..testing.mock_provider import MockOAuthProvider

    provider = MockOAuthProvider(
        client_id=f"demo-{secrets.token_hex(4)}",
        client_secret=secrets.token_urlsafe(24),
        account={"id": 4242, "login": "demo-user", "name": "Demo User"},
        users=[{"id": 4343, "login": "demo-user-2", "name": "Another Demo User"}],
        repos=[{"id": 1, "full_name": "demo-user/hello-world", "private": False}],
        display_name="Demo provider (mock)",
        sign_in_page=True,  # what a real provider shows: choose a user, approve or deny, narrow the scopes
    )
    keyed = MockKeyedApi(display_name="Demo API (mock, API key)")
    demo_key = keyed.add_key({"id": "demo-account", "name": "Demo User"})
    host = settings.server.host if is_loopback_host(settings.server.host) else "127.0.0.1"
    async with provider.serve_http(host, 0), keyed.serve_http(host, 0):
        catalog = _write_demo_catalog(
            settings, {DEMO_PROVIDER: provider.catalog_entry(), DEMO_KEY_PROVIDER: keyed.catalog_entry()}
        )
        env = {
            "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
            provider_env_var(DEMO_PROVIDER, "CLIENT_ID"): provider.client_id,
            provider_env_var(DEMO_PROVIDER, "CLIENT_SECRET"): provider.client_secret,
        }
        yield env, demo_key


def _write_demo_catalog(settings: Settings, entries: dict[str, dict[str, object]]) -> Path:
    """The catalog as configured (its entries are listed as not set up on /), plus the demo providers."""
    configured = settings.providers.catalog
    original = configured.read_text() if configured.is_file() else ""
    tables = "".join(f"\n[{name}]\n{_toml_table(entry)}\n" for name, entry in entries.items())
    DEMO_CATALOG.parent.mkdir(parents=True, exist_ok=True)
    DEMO_CATALOG.write_text(
        f"# Written by `acp-connector serve --demo` at every start: {configured} and the mock providers it serves\n"
        f"# on loopback.\n{original}\n{tables}"
    )
    return DEMO_CATALOG.resolve()


def _toml_table(entry: dict[str, object]) -> str:
    """`key = value` lines (JSON is TOML for strings, numbers, booleans and lists; tables become inline tables)."""
    return "\n".join(f"{key} = {_toml_value(value)}" for key, value in entry.items())


def _toml_value(value: object) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)


def _reload(invocation: Invocation, extra_env: dict[str, str]) -> Settings:
    """The settings again with `extra_env` added to the environment (the same file, the same checks)."""
    from ..config import load_settings

    return load_settings(getattr(invocation.args, "config", None), env={**invocation.env, **extra_env})
