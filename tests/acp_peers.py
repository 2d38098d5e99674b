"""ACP peers for tests: a recording transport, a small agent that uses the connector, and a recording client."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from acp import PROTOCOL_VERSION
from acp._transport import Transport, memory_transport_pair
from acp.agent.connection import AgentSideConnection
from acp.client.connection import ClientSideConnection
from acp.helpers import text_block, update_agent_message_text
from acp.interfaces import Client
from acp.schema import (
    AcceptElicitationResponse,
    AgentCapabilities,
    CancelElicitationResponse,
    ClientCapabilities,
    DeclineElicitationResponse,
    ElicitationCapabilities,
    ElicitationUrlCapabilities,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
)

from service import AuthorizationOutcome, Connector, Identity, SessionScope


class RecordingTransport:
    """Wraps one end of a transport pair and records every JSON-RPC message that crosses it."""

    def __init__(self, inner: Transport, log: list[tuple[str, dict[str, Any]]]) -> None:
        self._inner = inner
        self.log = log

    async def send(self, message: dict[str, Any]) -> None:
        self.log.append(("out", message))
        await self._inner.send(message)

    async def receive(self) -> dict[str, Any] | None:
        message = await self._inner.receive()
        if message is not None:
            self.log.append(("in", message))
        return message

    async def close(self) -> None:
        await self._inner.close()


class ConnectorAgent:
    """An agent whose prompt asks for GitHub access through the connector, then lists repos server-side."""

    def __init__(self, connector: Connector, user: Identity) -> None:
        self.connector = connector
        self.user = user
        self.conn: Client | None = None
        self.capabilities: ClientCapabilities | None = None
        self.outcomes: list[AuthorizationOutcome] = []

    def on_connect(self, conn: Client) -> None:
        self.conn = conn

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: ClientCapabilities | None = None,
        client_info: Any = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        self.capabilities = client_capabilities
        return InitializeResponse(protocol_version=PROTOCOL_VERSION, agent_capabilities=AgentCapabilities())

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        return NewSessionResponse(session_id="sess-1")

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        assert self.conn is not None
        outcome = await self.connector.request_authorization(
            self.conn,
            self.capabilities,
            user=self.user,
            provider="github",
            scopes=["repo"],
            scope=SessionScope(session_id, tool_call_id="call-1"),
        )
        self.outcomes.append(outcome)
        if outcome.ok:
            async with self.connector.http(self.user, "github") as github:
                response = await github.get("user/repos")
                names = ", ".join(repo["full_name"] for repo in response.json())
            text = f"Your repositories: {names}"
        else:
            text = outcome.describe()
        await self.conn.session_update(session_id, update_agent_message_text(text))
        return PromptResponse(stop_reason="end_turn")


@dataclass
class RecordingClient:
    """A client that answers elicitations as told and records what it received."""

    answer: str | Callable[[], Any] = "accept"
    elicitations: list[dict[str, Any]] = field(default_factory=list)
    completions: list[str] = field(default_factory=list)
    updates: list[Any] = field(default_factory=list)
    urls: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    completed: asyncio.Event = field(default_factory=asyncio.Event)

    async def create_elicitation(self, message: str, mode: Any, **kwargs: Any) -> Any:
        self.elicitations.append({"message": message, "mode": mode})
        self.urls.put_nowait(str(mode.url))
        if callable(self.answer):
            return self.answer()
        return {
            "accept": AcceptElicitationResponse(action="accept"),
            "decline": DeclineElicitationResponse(action="decline"),
            "cancel": CancelElicitationResponse(action="cancel"),
        }[self.answer]

    async def complete_elicitation(self, elicitation_id: str, **kwargs: Any) -> None:
        self.completions.append(elicitation_id)
        self.completed.set()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)

    def on_connect(self, conn: Any) -> None:
        pass


URL_CAPABLE = ClientCapabilities(elicitation=ElicitationCapabilities(url=ElicitationUrlCapabilities()))


@dataclass
class Wire:
    """One connected agent/client pair and the raw messages on the client's side of the wire."""

    agent: ConnectorAgent
    client: RecordingClient
    client_conn: ClientSideConnection
    agent_conn: AgentSideConnection
    messages: list[tuple[str, dict[str, Any]]]

    def received(self, method: str) -> list[dict[str, Any]]:
        """Messages the client received with this method."""
        return [m for d, m in self.messages if d == "in" and m.get("method") == method]

    async def close(self) -> None:
        await self.client_conn.close()
        await self.agent_conn.close()


async def connect(
    connector: Connector, user: Identity, client: RecordingClient, capabilities: ClientCapabilities | None = URL_CAPABLE
) -> Wire:
    agent_end, client_end = memory_transport_pair()
    messages: list[tuple[str, dict[str, Any]]] = []
    agent = ConnectorAgent(connector, user)
    agent_conn = AgentSideConnection(agent, agent_end, use_unstable_protocol=True)
    client_conn = ClientSideConnection(client, RecordingTransport(client_end, messages), use_unstable_protocol=True)
    await client_conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=capabilities)
    await client_conn.new_session(cwd="/")
    return Wire(agent, client, client_conn, agent_conn, messages)


def prompt_text(text: str) -> list[Any]:
    return [text_block(text)]
