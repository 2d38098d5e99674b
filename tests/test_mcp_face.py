"""The MCP face of the embedded connector (`Connector.mcp`): an `MCPServer` in this process, served over streamable
HTTP on loopback, its tools asking through the connector whose connect pages a scripted browser walks.

In process the completion is told by whichever comes first, the waiting call or the bus (and, for `-32042`, the
elicitation's follower): the database takes the telling once, so exactly one `notifications/elicitation/complete`
reaches the client that asked, none reaches another client, and the audit log says so.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
import uvicorn
from mcp.client.streamable_http import streamable_http_client
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import ClientCapabilities, InputRequiredResult
from pydantic import ValidationError

from service import Identity
from service.core.outcomes import AuthorizationOutcome
from service.mcp import NoVerifiedUser, advertised_modes, url_mode_advertised, user_from_access_token
from service.testing import ScriptedBrowser
from service.web.server import listening_socket

from .conftest import Deployment
from .mcp_support import COMPLETE, Asker, connected, text_of


def repositories_server(deployment: Deployment) -> MCPServer:
    """An MCP server whose tools get GitHub access for the deployment's local user through the connector."""
    server = MCPServer("embedded-face")
    connector = deployment.connector

    def said(outcome: AuthorizationOutcome | InputRequiredResult) -> str | InputRequiredResult:
        return outcome if isinstance(outcome, InputRequiredResult) else outcome.status.value

    @server.tool()
    async def ask(ctx: Context) -> str | InputRequiredResult:
        return said(await connector.mcp.request_authorization(ctx, user=deployment.local_user, provider="github"))

    @server.tool()
    async def ask_by_error(ctx: Context) -> str | InputRequiredResult:
        return said(await connector.mcp.require_authorization(ctx, user=deployment.local_user, provider="github"))

    return server


@asynccontextmanager
async def served(server: MCPServer) -> AsyncIterator[str]:
    """The server's streamable HTTP app on a loopback port (with its lifespan: the session manager)."""
    with listening_socket("127.0.0.1", 0) as sock:
        assert isinstance(sock, socket.socket)
        port = sock.getsockname()[1]
        config = uvicorn.Config(server.streamable_http_app(), log_config=None, lifespan="on")
        running = uvicorn.Server(config)
        task = asyncio.create_task(running.serve(sockets=[sock]))
        while not running.started:
            assert not task.done(), task.result()
            await asyncio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            running.should_exit = True
            await task


def transport(url: str) -> object:
    return streamable_http_client(url, http_client=httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300)))


async def completion_events(deployment: Deployment, elicitation_id: str) -> list[str]:
    rows = await deployment.connector.runtime.store.audit.list(elicitation_id=elicitation_id)
    return [row.event for row in rows if row.event.startswith("completion_")]


@pytest.mark.duration(4)
async def test_embedded_face_tells_the_asking_client_once_and_no_other(deployment: Deployment) -> None:
    async with served(repositories_server(deployment)) as url:
        async with (
            connected(transport(url), Asker("accept")) as asking,
            connected(transport(url), Asker("decline")) as other,
        ):
            # The other client was asked too (and declined), so the face knows its connection as well.
            assert text_of(await other.client.call_tool("ask", {})) == "declined"
            call = asking.call("ask")
            connect_url = await asking.asker.next_url()
            async with ScriptedBrowser() as browser:
                assert (await browser.authorize(connect_url)).status_code == 200
            assert text_of(await asyncio.wait_for(call, 30)) == "authorized"
            assert text_of(await other.client.call_tool("ask", {})) == "already_authorized"
            await asyncio.sleep(0.3)  # a stray notification would arrive by now
    (create,) = asking.wire.received("elicitation/create")
    elicitation_id = create["params"]["elicitationId"]
    assert [m["params"] for m in asking.wire.received(COMPLETE)] == [{"elicitationId": elicitation_id}]
    assert other.wire.received(COMPLETE) == [] and len(other.wire.received("elicitation/create")) == 1
    assert await completion_events(deployment, elicitation_id) == ["completion_sent"]
    for secret in deployment.provider.secrets_issued():
        assert secret not in asking.wire.text() and secret not in other.wire.text()
    assert deployment.connector.mcp.tables() == {"links": 0, "deliveries": 0, "watches": 0}


@pytest.mark.duration(4)
async def test_embedded_face_url_elicitation_required_then_retry(deployment: Deployment) -> None:
    async with served(repositories_server(deployment)) as url:
        async with connected(transport(url), Asker("accept")) as run:
            with pytest.raises(MCPError) as raised:
                await run.client.call_tool("ask_by_error", {})
            assert raised.value.error.code == -32042
            (elicitation,) = raised.value.error.data["elicitations"]
            async with ScriptedBrowser() as browser:
                assert (await browser.authorize(elicitation["url"])).status_code == 200
            for _ in range(200):
                if run.wire.received(COMPLETE):
                    break
                await asyncio.sleep(0.05)
            assert text_of(await run.client.call_tool("ask_by_error", {})) == "already_authorized"
    assert [m["params"] for m in run.wire.received(COMPLETE)] == [{"elicitationId": elicitation["elicitationId"]}]
    assert await completion_events(deployment, elicitation["elicitationId"]) == ["completion_sent"]


# -- capabilities, by MCP's rules: `{}` is form only; URL mode needs an explicit `url` object ---------------------
OMITTED = "<omitted>"
CAPABILITY_TABLE: list[tuple[Any, frozenset[str]]] = [
    (OMITTED, frozenset()),
    (None, frozenset()),
    ({}, frozenset({"form"})),  # MCP's compatibility rule (ACP: nothing)
    ({"form": {}}, frozenset({"form"})),
    ({"url": None}, frozenset()),
    ({"form": {}, "url": None}, frozenset({"form"})),
    ({"url": {}}, frozenset({"url"})),
    ({"form": {}, "url": {}}, frozenset({"form", "url"})),
    ({"form": None, "url": {}}, frozenset({"url"})),
    ({"url": True}, frozenset()),
    ({"url": {"_meta": {"x": 1}}}, frozenset({"url"})),
]
TABLE_IDS = [repr(row[0]) for row in CAPABILITY_TABLE]


def _capabilities(elicitation: Any) -> dict[str, Any]:
    return {} if elicitation == OMITTED else {"elicitation": elicitation}


@pytest.mark.parametrize(("elicitation", "modes"), CAPABILITY_TABLE, ids=TABLE_IDS)
def test_advertised_modes_follow_mcp_not_acp(elicitation: Any, modes: frozenset[str]) -> None:
    raw = _capabilities(elicitation)
    assert advertised_modes(raw) == modes
    assert url_mode_advertised(raw) is ("url" in modes)
    try:
        model = ClientCapabilities.model_validate(raw)
    except ValidationError:
        return  # not a shape the SDK's model takes (the raw JSON rule above still answers)
    # The model forgets a null `url`; whether URL mode is advertised reads the same either way.
    assert url_mode_advertised(model) is ("url" in modes)


@pytest.mark.duration(6)
async def test_capabilities_as_sent_on_the_wire(deployment: Deployment) -> None:
    """Each row of the table in a real `initialize`: only an explicit `url` object brings `elicitation/create`."""
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with served(repositories_server(deployment)) as url, httpx.AsyncClient(timeout=30) as http:
        for elicitation, modes in CAPABILITY_TABLE:
            init = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": _capabilities(elicitation),
                    "clientInfo": {"name": "raw", "version": "1"},
                },
            }
            answer = await http.post(url, json=init, headers=headers)
            assert answer.status_code == 200, answer.text
            session = {
                **headers,
                "Mcp-Session-Id": answer.headers["mcp-session-id"],
                "Mcp-Protocol-Version": "2025-11-25",
            }
            initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            assert (await http.post(url, json=initialized, headers=session)).status_code == 202
            call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "ask", "arguments": {}}}
            asked: list[dict[str, Any]] = []
            result: dict[str, Any] | None = None
            async with http.stream("POST", url, json=call, headers=session) as stream:
                async for line in stream.aiter_lines():
                    if not line.startswith("data:") or not line[5:].strip():
                        continue
                    message = json.loads(line[5:])
                    if message.get("method") == "elicitation/create":
                        asked.append(message)
                        reply = {"jsonrpc": "2.0", "id": message["id"], "result": {"action": "decline"}}
                        assert (await http.post(url, json=reply, headers=session)).status_code == 202
                    elif message.get("id") == 2:
                        result = message["result"]
                        break
            assert result is not None
            said = result["content"][0]["text"]
            if "url" in modes:
                assert [m["params"]["mode"] for m in asked] == ["url"] and said == "declined", elicitation
            else:
                assert asked == [] and said == "unsupported", elicitation
            await http.delete(url, headers=session)


# -- the user: the verified bearer of MCP's own authorization, never what the client says -----------------------
ISSUER = "https://login.example.com"


def _token(**overrides: Any) -> AccessToken:
    fields: dict[str, Any] = {
        "token": "t",
        "client_id": "c",
        "scopes": [],
        "subject": "alice",
        "claims": {"iss": ISSUER},
    }
    return AccessToken(**{**fields, **overrides})


def test_the_user_is_the_verified_bearers_subject_at_its_issuer() -> None:
    assert user_from_access_token(ISSUER, _token()) == Identity(ISSUER, "alice")
    assert user_from_access_token(ISSUER, _token(claims=None)) == Identity(ISSUER, "alice")  # iss not reported
    with pytest.raises(NoVerifiedUser):
        user_from_access_token(ISSUER)  # no verified bearer on this request
    with pytest.raises(NoVerifiedUser):
        user_from_access_token(ISSUER, _token(subject=None))
    with pytest.raises(NoVerifiedUser):
        user_from_access_token(ISSUER, _token(claims={"iss": "https://elsewhere.example.com"}))
