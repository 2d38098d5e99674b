"""The example MCP server: one tool that lists the user's repositories, with the connector as a sidecar.

Its tools need the user's access at a provider (GitHub, or `make run`'s demo provider). They ask the sidecar
(`SIDECAR_URL`, an API key in `SIDECAR_API_KEY`) through the connector's MCP face, `SidecarClient.mcp`:

- `list_repositories` asks on the client's connection (a URL-mode `elicitation/create`, or on a 2026-07-28
  connection an input-required result), waits while the user authorizes in the browser, then lists;
- `list_repositories_after_retry` answers the `-32042` error instead (URL elicitation required); the client opens the
  URL, gets `notifications/elicitation/complete` when the user is done, and calls the tool again.

The repositories are fetched through the sidecar's token proxy: the token never reaches this process, the client or
a model. The user is never something the client says: on stdio it is the one local user this server runs for
(`MCP_SERVER_USER_ISSUER` / `MCP_SERVER_USER_SUBJECT`); on streamable HTTP it is the subject of the OAuth bearer
the server verified (MCP's own authorization: `MCP_SERVER_AUTH_ISSUER`, `MCP_SERVER_AUTH_JWKS`). Logs go to stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import uvicorn
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import InputRequiredResult

from service import Identity, SidecarClient
from service.core.outcomes import AuthorizationOutcome, AuthorizationStatus
from service.mcp import NoVerifiedUser, user_from_access_token

from .auth import JwtVerifier, dev_token

log = logging.getLogger("examples.mcp_server")

NAME = "repositories-example"


@dataclass(frozen=True)
class Settings:
    sidecar_url: str
    sidecar_api_key: str
    provider: str
    scopes: list[str] | None
    local_user: Identity  # stdio: the one user this server runs for
    host: str
    port: int
    auth_issuer: str  # http: the authorization server whose bearer tokens name the user
    auth_jwks: str

    @property
    def resource_url(self) -> str:
        return f"http://{self.host}:{self.port}/mcp"

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Settings:
        scopes = env.get("MCP_SERVER_SCOPES", "").replace(",", " ").split()
        return cls(
            sidecar_url=env.get("SIDECAR_URL", "http://127.0.0.1:8700"),
            sidecar_api_key=env.get("SIDECAR_API_KEY", ""),
            provider=env.get("MCP_SERVER_PROVIDER", "github"),
            scopes=scopes or None,
            local_user=Identity(
                env.get("MCP_SERVER_USER_ISSUER", "local"), env.get("MCP_SERVER_USER_SUBJECT", "local-user")
            ),
            host=env.get("MCP_SERVER_HOST", "127.0.0.1"),
            port=int(env.get("MCP_SERVER_PORT", "8710")),
            auth_issuer=env.get("MCP_SERVER_AUTH_ISSUER", ""),
            auth_jwks=env.get("MCP_SERVER_AUTH_JWKS", ""),
        )


def build_server(settings: Settings, sidecar: SidecarClient, *, http: bool) -> MCPServer:
    """The MCP server with its two tools; on HTTP behind bearer authorization."""
    if http:
        server = MCPServer(
            NAME,
            token_verifier=JwtVerifier(settings.auth_issuer, settings.resource_url, settings.auth_jwks),
            auth=AuthSettings(issuer_url=settings.auth_issuer, resource_server_url=settings.resource_url),
        )
    else:
        server = MCPServer(NAME)

    def user() -> Identity:
        """The verified user of this request: the bearer's subject on HTTP, the local user on stdio."""
        return user_from_access_token(settings.auth_issuer) if http else settings.local_user

    async def listing(who: Identity, outcome: AuthorizationOutcome) -> str:
        if outcome.status not in (
            AuthorizationStatus.AUTHORIZED,
            AuthorizationStatus.ALREADY_AUTHORIZED,
            AuthorizationStatus.NARROWED,
        ):
            return outcome.describe()
        async with sidecar.http(who, settings.provider) as api:
            answer = await api.get("user/repos", params={"per_page": 100})
        if answer.status_code != 200:
            return f"The provider answered HTTP {answer.status_code}."
        names = [str(repo.get("full_name") or repo.get("name")) for repo in answer.json() if isinstance(repo, dict)]
        return "Your repositories:\n" + "\n".join(f"- {name}" for name in names) if names else "You have none."

    @server.tool()
    async def list_repositories(ctx: Context) -> str | InputRequiredResult:
        """List the user's repositories; asks for access in the browser first when it is not granted yet."""
        who = user()
        outcome = await sidecar.mcp.request_authorization(
            ctx, user=who, provider=settings.provider, scopes=settings.scopes
        )
        if isinstance(outcome, InputRequiredResult):
            return outcome  # 2026-07-28: the client answers and calls again
        return await listing(who, outcome)

    @server.tool()
    async def list_repositories_after_retry(ctx: Context) -> str | InputRequiredResult:
        """List the user's repositories; without access yet, the call fails with -32042 carrying the URL to open,
        and succeeds when called again after the user authorized."""
        who = user()
        outcome = await sidecar.mcp.require_authorization(
            ctx, user=who, provider=settings.provider, scopes=settings.scopes
        )
        if isinstance(outcome, InputRequiredResult):
            return outcome
        return await listing(who, outcome)

    return server


async def serve(settings: Settings, transport: str) -> None:
    async with SidecarClient(settings.sidecar_url, settings.sidecar_api_key) as sidecar:
        server = build_server(settings, sidecar, http=transport == "http")
        if transport == "stdio":
            await server.run_stdio_async()
            return
        app = server.streamable_http_app()
        config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning")
        log.info("MCP server at %s", settings.resource_url)
        await uvicorn.Server(config).serve()


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.mcp_server", description=__doc__.splitlines()[0])
    parser.add_argument("transport", choices=["stdio", "http", "dev-token"], nargs="?", default="stdio")
    parser.add_argument("--subject", default="local-user", help="dev-token: the token's subject")
    parser.add_argument("--jwks-file", default="var/mcp-dev-jwks.json", help="dev-token: where the JWKS is kept")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per sidecar call is noise
    settings = Settings.from_env(dict(os.environ))
    if args.transport == "dev-token":
        if not settings.auth_issuer:
            print("dev-token: set MCP_SERVER_AUTH_ISSUER (the issuer the token names)", file=sys.stderr)
            return 2
        token = dev_token(
            Path(args.jwks_file),
            issuer=settings.auth_issuer,
            audience=settings.resource_url,
            subject=args.subject,
        )
        print(token)
        return 0
    if not settings.sidecar_api_key:
        print("set SIDECAR_API_KEY (acp-connector api-keys create --tenant mcp-example)", file=sys.stderr)
        return 2
    if args.transport == "http" and not (settings.auth_issuer and settings.auth_jwks):
        print("http: set MCP_SERVER_AUTH_ISSUER and MCP_SERVER_AUTH_JWKS (the authorization server)", file=sys.stderr)
        return 2
    try:
        anyio.run(serve, settings, args.transport)
    except KeyboardInterrupt:
        return 0
    except (NoVerifiedUser, httpx.HTTPError) as exc:
        print(f"mcp_server: {exc}", file=sys.stderr)
        return 1
    return 0
