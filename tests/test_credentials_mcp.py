"""An API key asked for by an MCP server's tool through the connector's MCP face (the official `mcp` SDK on both
ends, streamable HTTP): URL-mode elicitation to the connector's page, the key typed there, one completion
notification to the asking client, and the key nowhere on the MCP wire."""

from __future__ import annotations

import asyncio

import pytest
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import InputRequiredResult

from service.testing import MockKeyedApi, ScriptedBrowser

from .conftest import Deployment
from .credential_support import KEYED, keyed_connector, to_form, type_key
from .mcp_support import COMPLETE, Asker, connected, text_of
from .test_mcp_face import served, transport

deployment = keyed_connector  # every test here runs on the deployment with the keyed entry


@pytest.mark.duration(4)
async def test_an_mcp_tool_gets_an_api_key_typed_on_the_connectors_page(
    deployment: Deployment, keyed: MockKeyedApi
) -> None:
    key = keyed.add_key({"id": "acct_mcp"})
    server = MCPServer("keyed-tools")
    connector = deployment.connector

    @server.tool()
    async def ask(ctx: Context) -> str | InputRequiredResult:
        outcome = await connector.mcp.request_authorization(ctx, user=deployment.local_user, provider=KEYED)
        return outcome if isinstance(outcome, InputRequiredResult) else outcome.status.value

    async with served(server) as url, connected(transport(url), Asker("accept")) as asking:
        call = asking.call("ask")
        connect_url = await asking.asker.next_url()
        async with ScriptedBrowser() as browser:
            done = await type_key(browser, await to_form(browser, connect_url), key)
            assert done.status_code == 200
        assert text_of(await asyncio.wait_for(call, 30)) == "authorized"
        async with connector.http(deployment.local_user, KEYED) as client:
            assert (await client.get("/v1/items")).status_code == 200
    (create,) = asking.wire.received("elicitation/create")
    assert create["params"]["mode"] == "url"
    assert [m["params"] for m in asking.wire.received(COMPLETE)] == [
        {"elicitationId": create["params"]["elicitationId"]}
    ]
    assert key not in asking.wire.text() and key[8:] not in asking.wire.text()
