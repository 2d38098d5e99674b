"""`acp-connector mock-provider`: the test kit's mock OAuth provider, served on loopback."""

from __future__ import annotations

import json

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
            "30-second access tokens; --narrow refuses the scopes named (a narrowed grant)."
        ),
        examples=[
            "CONNECTOR_PROVIDER_GITHUB_CLIENT_ID=dev CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET=dev "
            "acp-connector mock-provider --port 8701",
            "acp-connector mock-provider --strict --narrow repo",
        ],
    )
    mock.add_argument("--host", default="127.0.0.1", help="loopback address to listen on (default: 127.0.0.1)")
    mock.add_argument(
        "--port",
        type=port_number(lowest=0),
        default=8701,
        help="port to listen on, 0 for any free port (default: 8701)",
    )
    mock.add_argument("--name", default="github", help="catalog name whose credentials it accepts (default: github)")
    mock.add_argument("--strict", action="store_true", help="behave like a strictly conformant OpenID provider")
    mock.add_argument("--narrow", nargs="*", default=[], metavar="SCOPE", help="scopes the consent refuses")
    mock.add_argument(
        "--sign-in-page",
        action="store_true",
        help="show a sign-in page at /authorize (choose a user, approve or deny, untick scopes) instead of "
        "consenting at once",
    )


def run(invocation: Invocation) -> int:
    import asyncio

    from ..providers import provider_env_var
    from ..testing.mock_provider import MockOAuthProvider

    args = invocation.args
    id_var, secret_var = provider_env_var(args.name, "CLIENT_ID"), provider_env_var(args.name, "CLIENT_SECRET")
    client_id, client_secret = invocation.env.get(id_var), invocation.env.get(secret_var)
    if not client_id or not client_secret:
        raise UsageError(
            f"mock-provider: no client credentials for '{args.name}'",
            f"set {id_var} and {secret_var} to any values; the agent's connector uses the same",
        )
    make = MockOAuthProvider.strict if args.strict else MockOAuthProvider
    provider = make(
        client_id=client_id, client_secret=client_secret, narrow_scopes=set(args.narrow), sign_in_page=args.sign_in_page
    )

    def ready(base_url: str) -> None:
        entry = "\n".join(f"{key} = {json.dumps(value)}" for key, value in provider.catalog_entry().items())
        invocation.out(f"# mock OAuth provider at {base_url}; a providers.toml entry for it:\n[{args.name}]\n{entry}")

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
