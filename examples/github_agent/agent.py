"""The GitHub example agent: one ACP agent over stdio, with the connector embedded in its process.

Every prompt runs one tool, "list my GitHub repositories": the agent asks the connector for the user's GitHub
access (a URL-mode `elicitation/create` pointing at the connector's connect page, served by this same process),
waits until the user has authorized in the browser, then lists the repositories server-side through
`connector.http(user, "github")`. The token never reaches ACP, the client or a model. `session/cancel` cancels the
running prompt.

Stdout carries ACP only; logs go to stderr. Configuration is the connector's (`CONNECTOR_CONFIG` or
config/connector.toml, and `CONNECTOR_*` variables); see README.md next to this file.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import uuid
from contextlib import suppress
from typing import Any

import httpx
from acp import (
    PROTOCOL_VERSION,
    RequestError,
    run_agent,
    start_tool_call,
    text_block,
    tool_content,
    update_agent_message_text,
    update_tool_call,
)
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    ClientCapabilities,
    Implementation,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
)

from service import (
    ConfigError,
    Connector,
    ConnectorError,
    Identity,
    NotAuthorized,
    SchemaNotCurrent,
    SessionScope,
    load_settings,
    use_development_key,
)
from service.logs import configure

log = logging.getLogger("examples.github_agent")

AGENT_INFO = Implementation(name="github-agent", title="GitHub repositories (connector example)", version="0.1.0")
PROVIDER = os.environ.get("GITHUB_AGENT_PROVIDER", "github")  # the catalog entry to use


def _requested_scopes() -> list[str] | None:
    """GITHUB_AGENT_SCOPES (space or comma separated); unset: the catalog's default scopes."""
    raw = os.environ.get("GITHUB_AGENT_SCOPES", "").replace(",", " ").split()
    return raw or None


class GitHubAgent:
    """An `acp.Agent`: sessions, prompts (each runs the repository tool), and `session/cancel`."""

    def __init__(self, connector: Connector, user: Identity, web: asyncio.Task[None]) -> None:
        self.connector = connector
        self.user = user  # the user this agent acts for, as the connector's verifier will recognise them
        self.web = web  # the connect-page server running in this process
        self.scopes = _requested_scopes()
        self.conn: Client | None = None
        self.capabilities: ClientCapabilities | None = None
        self.sessions: set[str] = set()
        self.turns: dict[str, asyncio.Task[PromptResponse]] = {}

    def on_connect(self, conn: Client) -> None:
        self.conn = conn
        attach = getattr(self.connector, "attach", None)  # newer connectors track the connection from the start
        if attach is not None:
            attach(conn)

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: ClientCapabilities | None = None,
        client_info: Implementation | None = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        self.capabilities = client_capabilities
        return InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(),
            agent_info=AGENT_INFO,
        )

    async def authenticate(self, method_id: str, **kwargs: Any) -> None:
        return None

    async def new_session(self, cwd: str, mcp_servers: list[Any] | None = None, **kwargs: Any) -> NewSessionResponse:
        session_id = f"sess_{uuid.uuid4().hex}"
        self.sessions.add(session_id)
        return NewSessionResponse(session_id=session_id)

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        if session_id not in self.sessions:
            raise RequestError.invalid_params({"sessionId": "unknown session"})
        if session_id in self.turns:
            raise RequestError.invalid_request({"sessionId": "a prompt is already running in this session"})
        turn = asyncio.create_task(self._list_repositories_turn(session_id))
        self.turns[session_id] = turn
        try:
            return await turn
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if turn.cancelled() and (current is None or current.cancelling() == 0):
                return PromptResponse(stop_reason="cancelled")  # session/cancel: the turn ends, the connection stays
            raise
        finally:
            self.turns.pop(session_id, None)

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        """`session/cancel`: stop the session's running prompt; the connector withdraws what it was waiting for."""
        turn = self.turns.get(session_id)
        if turn is not None and not turn.done():
            turn.cancel()

    # -- the tool --------------------------------------------------------------------------------------------
    async def _list_repositories_turn(self, session_id: str) -> PromptResponse:
        conn = self.conn
        assert conn is not None
        tool_call_id = f"call_{uuid.uuid4().hex[:16]}"
        await conn.session_update(
            session_id,
            start_tool_call(tool_call_id, "List your GitHub repositories", kind="fetch", status="in_progress"),
        )
        if self.web.done():
            return await self._finish(session_id, tool_call_id, "The connect page server is not running.", ok=False)
        try:
            outcome = await self.connector.request_authorization(
                conn,
                self.capabilities,
                user=self.user,
                provider=PROVIDER,
                scope=SessionScope(session_id, tool_call_id=tool_call_id),
                scopes=self.scopes,
            )
        except asyncio.CancelledError:
            # session/cancel: close the tool call before the prompt answers "cancelled".
            with suppress(Exception):
                await conn.session_update(session_id, update_tool_call(tool_call_id, status="failed"))
            raise
        if not outcome.ok:
            return await self._finish(session_id, tool_call_id, outcome.describe(), ok=False)
        try:
            names = await self._repository_names()
        except NotAuthorized:
            return await self._finish(session_id, tool_call_id, "GitHub access is no longer granted.", ok=False)
        except (httpx.HTTPError, ConnectorError, ValueError) as exc:
            log.warning("listing repositories failed: %s", type(exc).__name__)
            return await self._finish(session_id, tool_call_id, "GitHub could not be reached.", ok=False)
        if not names:
            return await self._finish(session_id, tool_call_id, "You have no repositories.", ok=True)
        listing = "\n".join(f"- {name}" for name in names)
        return await self._finish(session_id, tool_call_id, f"Your repositories ({len(names)}):\n{listing}", ok=True)

    async def _repository_names(self) -> list[str]:
        """The user's repositories, fetched server-side: the connector adds (and refreshes) the token."""
        async with self.connector.http(self.user, PROVIDER) as github:
            response = await github.get(
                "user/repos",
                params={"per_page": 100, "sort": "updated"},
                headers={"Accept": "application/vnd.github+json"},
            )
        if response.status_code != 200:
            raise httpx.HTTPStatusError(f"HTTP {response.status_code}", request=response.request, response=response)
        return [str(repo.get("full_name") or repo.get("name")) for repo in response.json() if isinstance(repo, dict)]

    async def _finish(self, session_id: str, tool_call_id: str, text: str, *, ok: bool) -> PromptResponse:
        conn = self.conn
        assert conn is not None
        await conn.session_update(
            session_id,
            update_tool_call(
                tool_call_id, status="completed" if ok else "failed", content=[tool_content(text_block(text))]
            ),
        )
        await conn.session_update(session_id, update_agent_message_text(text))
        return PromptResponse(stop_reason="end_turn")


def local_user(connector: Connector) -> Identity:
    """The user to act for. With the `local` verifier it is the one configured local user.

    Any other verifier checks the person in the browser against an identity the agent itself verified (e.g. at
    ACP `authenticate`); this example has no such step, so it runs only with the local verifier.
    """
    verifier = connector.settings.identity.verifier
    user = getattr(connector.verifier, "user", None)
    if verifier != "local" or user is None:
        raise ConfigError(
            str(connector.settings.config_file or "environment"),
            "identity.verifier",
            f"the GitHub example agent acts for the local user only, but the verifier is '{verifier}'",
        )
    identity = user()
    assert isinstance(identity, Identity)
    return identity


async def _until_serving(connector: Connector, web: asyncio.Task[None], *, attempts: int = 100) -> None:
    """Wait until the connect pages answer (`/healthz`), so no link is sent before they can be opened."""
    server = connector.settings.server
    host = "127.0.0.1" if server.host in ("0.0.0.0", "") else server.host  # noqa: S104 - mapping, not binding
    url = f"http://{f'[{host}]' if ':' in host else host}:{server.port}/healthz"
    async with httpx.AsyncClient(timeout=1.0) as probe:
        for _ in range(attempts):
            if web.done():
                web.result()  # re-raise why the server stopped (e.g. the port is taken)
                raise RuntimeError("the connect page server stopped")
            with suppress(httpx.HTTPError):
                if (await probe.get(url)).status_code == 200:
                    return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"the connect page server did not answer at {url}")


async def main(config: str | None = None) -> None:
    """Build the connector from config, serve its connect pages, and speak ACP on stdin/stdout until EOF."""
    settings = load_settings(config)
    configure(settings.log_format)  # to stderr: stdout belongs to ACP
    # Like `acp-connector serve`: on loopback without a configured key, a development key file (var/vault.keys).
    connector = Connector.from_settings(use_development_key(settings))
    try:
        await connector.start()  # refuses an unmigrated database
        user = local_user(connector)
        web = asyncio.create_task(connector.serve(), name="connector-web")
        await _until_serving(connector, web)
        log.info("connect pages at %s/connect/<id>", connector.settings.public_base_url)
        try:
            await run_agent(GitHubAgent(connector, user, web), use_unstable_protocol=True)  # type: ignore[arg-type]
        finally:
            web.cancel()
            with suppress(asyncio.CancelledError):
                await web
    finally:
        await connector.close()


def run() -> int:
    try:
        asyncio.run(main(os.environ.get("CONNECTOR_CONFIG") or None))
    except ConfigError as exc:
        print(f"github-agent: config error: {exc}", file=sys.stderr)
        return 2
    except (SchemaNotCurrent, ConnectorError) as exc:  # e.g. "run acp-connector migrate", no database
        print(f"github-agent: {exc.code}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. the connect-page port is taken
        print(f"github-agent: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        # Everything is closed by now. A client that closes our stdin waits for us to exit: spare it the
        # interpreter's final walk over every object of the libraries loaded (a second or more on a busy machine).
        gc.freeze()
    return 0
