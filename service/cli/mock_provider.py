"""`acp-connector mock-provider`: the test kit's mock OAuth provider, served on loopback."""

from __future__ import annotations

from typing import Any

from .framework import CliError, Commands, Invocation, UsageError, port_number


def register(commands: Commands) -> None:
    mock = commands.command(
        "mock-provider",
        run,
        help="serve a mock OAuth provider on loopback, for testing agents",
        description=(
            "Serve the test kit's mock OAuth provider (service.testing.MockOAuthProvider) on a loopback port\n"
            "until interrupted. It checks client credentials, redirect URI, PKCE and codes like a real provider,\n"
            "and accepts the credentials in CONNECTOR_PROVIDER_<NAME>_CLIENT_ID / _CLIENT_SECRET (any values:\n"
            "the connector under test uses the same). On start it prints a providers.toml entry for itself.\n\n"
            "--strict makes it as strict as a conformant OpenID provider: Basic credentials form-decoded\n"
            "(RFC 6749 2.3.1), offline_access dropped without prompt=consent and refresh tokens only with it,\n"
            "30-second access tokens; --narrow refuses the scopes named (a narrowed grant).\n\n"
            "--like NAME emulates the shipped catalog's entry NAME (config/providers.toml) instead: its URLs moved\n"
            "onto the mock, its quirks insisted on (token response shape, request encoding, client\n"
            "authentication, per-connection values, API token header, revocation style); the printed table is\n"
            "that entry pointing at the mock. --name defaults to NAME then.\n\n"
            "--legacy makes the code exchange answer a legacy token (non-expiring, no refresh token), as Shopify\n"
            "did before its expiring offline tokens: a grant connected then is a legacy one, which the connector\n"
            "migrates at its first use by the token exchange its entry declares (legacy_token_exchange); the mock\n"
            "answers that exchange as Shopify does (the old token dead after it, a retry answered the same pair)."
        ),
        examples=[
            "CONNECTOR_PROVIDER_GITHUB_CLIENT_ID=dev CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET=dev "
            "acp-connector mock-provider --port 8701",
            "acp-connector mock-provider --strict --narrow repo",
            "CONNECTOR_PROVIDER_SLACK_CLIENT_ID=dev CONNECTOR_PROVIDER_SLACK_CLIENT_SECRET=dev "
            "acp-connector mock-provider --like slack --port 0",
            "CONNECTOR_PROVIDER_SHOPIFY_CLIENT_ID=dev CONNECTOR_PROVIDER_SHOPIFY_CLIENT_SECRET=dev "
            "acp-connector mock-provider --like shopify --legacy",
        ],
    )
    mock.add_argument("--host", default="127.0.0.1", help="loopback address to listen on (default: 127.0.0.1)")
    mock.add_argument(
        "--port",
        type=port_number(lowest=0),
        default=8701,
        help="port to listen on, 0 for any free port (default: 8701)",
    )
    mock.add_argument(
        "--name", default=None, help="catalog name whose credentials it accepts (default: github, or --like's NAME)"
    )
    mock.add_argument("--like", metavar="NAME", help="emulate the shipped catalog's entry NAME and its quirks")
    mock.add_argument("--strict", action="store_true", help="behave like a strictly conformant OpenID provider")
    mock.add_argument("--narrow", nargs="*", default=[], metavar="SCOPE", help="scopes the consent refuses")
    mock.add_argument(
        "--legacy", action="store_true", help="the code exchange answers legacy (non-expiring) tokens, to migrate"
    )
    mock.add_argument(
        "--sign-in-page",
        action="store_true",
        help="show a sign-in page at /authorize (choose a user, approve or deny, untick scopes) instead of "
        "consenting at once",
    )


def run(invocation: Invocation) -> int:
    import asyncio

    from ..providers import provider_env_var
    from ..testing.mock_like import EmulatedProvider, catalog_table
    from ..testing.mock_provider import MockOAuthProvider
    from ..testing.toml_text import toml_table

    args = invocation.args
    args.name = args.name or args.like or "github"
    id_var, secret_var = provider_env_var(args.name, "CLIENT_ID"), provider_env_var(args.name, "CLIENT_SECRET")
    client_id, client_secret = invocation.env.get(id_var), invocation.env.get(secret_var)
    if not client_id or not client_secret:
        raise UsageError(
            f"mock-provider: no client credentials for '{args.name}'",
            f"set {id_var} and {secret_var} to any values; the agent's connector uses the same",
        )
    fields: dict[str, Any] = {"client_id": client_id, "client_secret": client_secret, "narrow_scopes": set(args.narrow)}
    fields["sign_in_page"] = args.sign_in_page
    provider: MockOAuthProvider
    if args.like:
        try:
            catalog_table(args.like)
        except KeyError as exc:
            raise UsageError(f"mock-provider: {exc.args[0]}", "name an entry of config/providers.toml") from None
        provider = EmulatedProvider.like(args.like, **fields)
    else:
        provider = (MockOAuthProvider.strict if args.strict else MockOAuthProvider)(**fields)
    provider.legacy.on_code_exchange = args.legacy

    def ready(base_url: str) -> None:
        table = toml_table(args.name, provider.catalog_entry())
        invocation.out(f"# mock OAuth provider at {base_url}; a providers.toml entry for it:\n{table}")

    try:
        asyncio.run(provider.serve_forever(args.host, args.port, on_ready=ready))
    except ValueError as exc:
        raise UsageError(f"mock-provider: {exc}", "use 127.0.0.1 or ::1") from None
    except OSError as exc:
        raise CliError(
            f"mock-provider: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
            "choose another --port (0 picks a free one)",
        ) from None
    return 0
