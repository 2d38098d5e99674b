"""ACP peers for tests: a recording transport, a small agent that uses the connector, and a recording client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from acp import PROTOCOL_VERSION
from acp.agent.connection import AgentSideConnection
from acp.client.connection import ClientSideConnection
from acp.connection import Connection, StreamDirection, StreamEvent
from acp.exceptions import RequestError
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

from service import AuthorizationOutcome, Connector, Identity, RequestScope, SessionScope
from service.client import SidecarClient, SidecarUnavailable
from service.testing import ScriptedClient, memory_transport_pair
from service.testing.acp_client import Transport

# The agent's side of the connector: embedded, or a client of a sidecar. Both offer the same calls.
AgentFacing = Connector | SidecarClient


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait until `check()` holds (a condition, not a fixed delay); fail after 10 s naming `what`."""
    try:
        async with asyncio.timeout(10):
            while not await check():  # noqa: ASYNC110 - the condition lives in the database, no event to await
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None


class HasElicitations(Protocol):
    async def elicitation(self, elicitation_id: str) -> Any: ...


async def status_is(where: HasElicitations, elicitation_id: str, status: Any) -> bool:
    """Whether the stored elicitation has `status` (`where`: a `Connector`, or anything that reads the store)."""
    record = await where.elicitation(elicitation_id)
    return record is not None and record.status is status


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

    def __init__(self, connector: AgentFacing, user: Identity, *, attach: bool = True) -> None:
        self.connector = connector
        self.user = user
        self.attach = attach
        self.conn: Client | None = None
        self.capabilities: ClientCapabilities | None = None
        self.outcomes: list[AuthorizationOutcome] = []
        self.states: list[tuple[str, str]] = []  # foreground transitions heard through the listener
        self.prompt_tasks: dict[str, asyncio.Task[Any]] = {}
        self.cancelled: list[str] = []
        self.scope_for: Callable[[str], SessionScope | RequestScope] = lambda sid: SessionScope(sid, "call-1")
        self.foreground = True
        self.scopes = ["repo"]
        self.ask_again = False  # passed to request_authorization
        self.timeout: float | None = None  # the agent's own limit on request_authorization (asyncio.wait_for)
        self.deadline: float | None = None  # the same with asyncio.timeout, which `_test/time_out` runs out at once
        self.authorizations: dict[str, asyncio.Task[AuthorizationOutcome]] = {}  # the running one, per session
        self.deadlines: dict[str, asyncio.Timeout] = {}
        self.stops: list[str] = []  # "timeout" / "cancelled": request_authorization stopped and the prompt went on

    def on_connect(self, conn: Client) -> None:
        self.conn = conn
        if self.attach:
            self.connector.attach(conn, on_state=lambda session, state: self.states.append((session, state.value)))

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: ClientCapabilities | None = None,
        client_info: Any = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        self.capabilities = client_capabilities
        # Speak v2 when the client asks for it (the connector reads v2 capabilities from the wire).
        version = 2 if protocol_version >= 2 else PROTOCOL_VERSION
        return InitializeResponse(protocol_version=version, agent_capabilities=AgentCapabilities())

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        task = self.prompt_tasks.get(session_id)
        if task is not None and not task.done():
            self.cancelled.append(session_id)
            task.cancel()

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        return NewSessionResponse(session_id="sess-1")

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        """`_test/cancel_authorization {sessionId}`: the agent's own code cancels the running authorization;
        `_test/time_out {sessionId}`: the agent's own deadline (`deadline`) runs out now."""
        session_id = str(params.get("sessionId"))
        if method == "test/cancel_authorization":
            task = self.authorizations.get(session_id)
            if task is not None:
                task.cancel()
        elif method == "test/time_out":
            deadline = self.deadlines.get(session_id)
            if deadline is not None:
                deadline.reschedule(asyncio.get_running_loop().time())

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        assert self.conn is not None
        task = asyncio.current_task()
        assert task is not None
        self.prompt_tasks[session_id] = task
        try:
            return await self._prompt(session_id)
        except asyncio.CancelledError:
            if session_id not in self.cancelled:
                raise  # the connection is closing, not a session/cancel: nothing to answer
            return PromptResponse(stop_reason="cancelled")

    async def _prompt(self, session_id: str) -> PromptResponse:
        assert self.conn is not None
        authorization = asyncio.ensure_future(
            self.connector.request_authorization(
                self.conn,
                self.capabilities,
                user=self.user,
                provider="github",
                scopes=self.scopes,
                scope=self.scope_for(session_id),
                foreground=self.foreground,
                ask_again=self.ask_again,
            )
        )
        self.authorizations[session_id] = authorization
        try:
            if self.deadline is not None:
                async with asyncio.timeout(self.deadline) as deadline:
                    self.deadlines[session_id] = deadline
                    outcome = await authorization
            else:
                outcome = await (
                    asyncio.wait_for(authorization, self.timeout) if self.timeout is not None else authorization
                )
        except TimeoutError:
            self.stops.append("timeout")
            text = "Authorization took too long."
        except SidecarUnavailable as exc:  # the sidecar stayed away until the request expired: say so
            text = str(exc)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not authorization.cancelled() or (current is not None and current.cancelling()):
                raise  # this prompt itself is being cancelled
            self.stops.append("cancelled")  # only the authorization was cancelled (by the test, as the agent)
            text = "Authorization was cancelled."
        else:
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

    async def next_url(self) -> str:
        return await asyncio.wait_for(self.urls.get(), 10)

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
    connector: AgentFacing,
    user: Identity,
    client: RecordingClient,
    capabilities: ClientCapabilities | None = URL_CAPABLE,
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


class RawClient:
    """A client speaking raw JSON-RPC through the SDK's `Connection`, for shapes the SDK's client models
    cannot send (v2 `capabilities`, explicit nulls) and for precise control over when answers go out.

    `answer` is the result for `elicitation/create` (a dict), or a `RequestError` to raise. With `hold` set,
    answers wait until `release()`; a `$/cancel_request` for a held request answers it with -32800.
    """

    def __init__(self, answer: dict[str, Any] | RequestError | None = None, *, hold: bool = False) -> None:
        self.answer: dict[str, Any] | RequestError = answer if answer is not None else {"action": "accept"}
        self.messages: list[tuple[str, dict[str, Any]]] = []
        self.creates: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._gate = asyncio.Event()
        if not hold:
            self._gate.set()
        self._request_ids: dict[str, Any] = {}
        self._cancelled: dict[Any, asyncio.Event] = {}
        self.conn: Connection | None = None

    def release(self) -> None:
        self._gate.set()

    async def next_create(self) -> dict[str, Any]:
        """The params of the next elicitation/create; a test never waits forever for one that does not come."""
        return await asyncio.wait_for(self.creates.get(), 10)

    def received(self, method: str) -> list[dict[str, Any]]:
        return [m for d, m in self.messages if d == "in" and m.get("method") == method]

    def sent(self, method: str | None = None) -> list[dict[str, Any]]:
        return [m for d, m in self.messages if d == "out" and (method is None or m.get("method") == method)]

    def _observe(self, event: StreamEvent) -> None:
        message = event.message
        if event.direction is StreamDirection.INCOMING and message.get("method") == "elicitation/create":
            self._request_ids[message["params"]["elicitationId"]] = message["id"]

    async def handle(self, method: str, params: Any, is_notification: bool) -> Any:
        if method == "elicitation/create":
            request_id = self._request_ids.get(params["elicitationId"])
            cancelled = self._cancelled.setdefault(request_id, asyncio.Event())
            self.creates.put_nowait(params)
            gate = asyncio.create_task(self._gate.wait())
            cancel = asyncio.create_task(cancelled.wait())
            await asyncio.wait({gate, cancel}, return_when=asyncio.FIRST_COMPLETED)
            gate.cancel()
            cancel.cancel()
            if cancelled.is_set():
                raise RequestError(-32800, "Request cancelled")
            if isinstance(self.answer, RequestError):
                raise self.answer
            return self.answer
        if method == "$/cancel_request":
            self._cancelled.setdefault(params["requestId"], asyncio.Event()).set()
            return None
        if is_notification:
            return None
        raise RequestError.method_not_found(method)

    async def start(self, transport: Transport) -> None:
        self.conn = Connection(self.handle, RecordingTransport(transport, self.messages), observers=[self._observe])

    async def initialize(self, params: dict[str, Any]) -> Any:
        assert self.conn is not None
        return await self.conn.send_request("initialize", params)

    async def new_session(self) -> str:
        assert self.conn is not None
        result = await self.conn.send_request("session/new", {"cwd": "/", "mcpServers": []})
        return str(result["sessionId"])

    async def prompt(self, session_id: str) -> Any:
        assert self.conn is not None
        return await self.conn.send_request(
            "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "go"}]}
        )

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        assert self.conn is not None
        await self.conn.send_notification(method, params)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()


@asynccontextmanager
async def raw_peer(
    connector: AgentFacing, user: Identity, client: RawClient, initialize: dict[str, Any]
) -> AsyncIterator[ConnectorAgent]:
    """`connect_raw`, closing both ends when the block ends (also when a test fails inside it)."""
    agent, agent_conn = await connect_raw(connector, user, client, initialize)
    try:
        yield agent
    finally:
        await client.close()
        await agent_conn.close()


async def connect_raw(
    connector: AgentFacing, user: Identity, client: RawClient, initialize: dict[str, Any]
) -> tuple[ConnectorAgent, AgentSideConnection]:
    agent_end, client_end = memory_transport_pair()
    agent = ConnectorAgent(connector, user)
    agent_conn = AgentSideConnection(agent, agent_end, use_unstable_protocol=True)
    await client.start(client_end)
    await client.initialize(initialize)
    return agent, agent_conn


@dataclass
class ScriptedWire:
    """The connector's test agent and a `ScriptedClient` (the SDK's client) over the in-memory transport."""

    agent: ConnectorAgent
    agent_conn: AgentSideConnection
    conn: ClientSideConnection
    session_id: str

    def prompt(self) -> asyncio.Task[Any]:
        return asyncio.create_task(self.conn.prompt(session_id=self.session_id, prompt=prompt_text("go")))


@asynccontextmanager
async def scripted_peer(
    connector: Connector, user: Identity, client: ScriptedClient, agent: ConnectorAgent | None = None
) -> AsyncIterator[ScriptedWire]:
    """Connected, initialized, one session open; both ends closed when the block ends."""
    agent = agent or ConnectorAgent(connector, user)
    agent_end, client_end = memory_transport_pair()
    agent_conn = AgentSideConnection(agent, agent_end, use_unstable_protocol=True)
    conn = client.connect(client_end)
    try:
        await asyncio.wait_for(client.initialize(conn), 10)
        session = await asyncio.wait_for(conn.new_session(cwd="/"), 10)
        yield ScriptedWire(agent, agent_conn, conn, session.session_id)
    finally:
        await conn.close()
        await agent_conn.close()
