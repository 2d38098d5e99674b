"""The GitHub example agent as a real subprocess over stdio, against the mock provider served over loopback HTTP.

The agent process embeds the connector (its connect pages on an ephemeral loopback port); the test is the ACP client
(`ScriptedClient`, which records the wire) and the user's browser (`ScriptedBrowser`).
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from acp import text_block

from service.store import migrate
from service.testing import MockOAuthProvider, ScriptedBrowser, ScriptedClient, spawn_agent
from service.testing.acp_client import NO_ELICITATION, SpawnedAgent
from service.vault import generate_key

from .conftest import write_catalog

REPO = Path(__file__).resolve().parents[1]
REPOS = [
    {"id": 1, "full_name": "octocat/hello-world", "private": False},
    {"id": 2, "full_name": "octocat/spoon-knife", "private": True},
]


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Setup:
    provider: MockOAuthProvider
    env: dict[str, str]
    base_url: str


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    provider = MockOAuthProvider(repos=REPOS)
    async with provider.serve_http() as provider_url:
        assert provider_url.startswith("http://127.0.0.1:")
        port = _free_loopback_port()
        config = tmp_path / "connector.toml"
        config.write_text("# everything comes from CONNECTOR_* variables in this test\n")
        db_url = f"sqlite+aiosqlite:///{tmp_path / 'connector.db'}"
        migrate(db_url)  # the agent refuses an unmigrated database
        env = {
            "CONNECTOR_CONFIG": str(config),
            "CONNECTOR_PUBLIC_BASE_URL": f"http://127.0.0.1:{port}",
            "CONNECTOR_SERVER__HOST": "127.0.0.1",
            "CONNECTOR_SERVER__PORT": str(port),
            "CONNECTOR_DATABASE__URL": db_url,
            "CONNECTOR_VAULT__KEYS": generate_key("k1"),
            "CONNECTOR_PROVIDERS__CATALOG": str(
                write_catalog(tmp_path / "providers.toml", {"github": provider.catalog_entry()})
            ),
            "CONNECTOR_AGENT_NAME": "GitHub example agent",
            "CONNECTOR_PROVIDER_GITHUB_CLIENT_ID": provider.client_id,
            "CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET": provider.client_secret,
            "PYTHONUNBUFFERED": "1",
        }
        yield Setup(provider, env, f"http://127.0.0.1:{port}")


def _agent(client: ScriptedClient, setup: Setup):  # type: ignore[no-untyped-def]
    return spawn_agent(client, sys.executable, "-m", "examples.github_agent", env=setup.env, cwd=REPO)


async def _open_session(client: ScriptedClient, agent: SpawnedAgent) -> str:
    await asyncio.wait_for(client.initialize(agent.conn), 30)
    session = await asyncio.wait_for(agent.conn.new_session(cwd=str(REPO)), 10)
    return session.session_id


def _prompt(agent: SpawnedAgent, session_id: str) -> asyncio.Task:  # type: ignore[type-arg]
    return asyncio.create_task(agent.conn.prompt(session_id=session_id, prompt=[text_block("list my repositories")]))


async def test_stdio_agent_lists_repositories_after_the_connect_page_flow(setup: Setup) -> None:
    provider = setup.provider
    client = ScriptedClient("accept")
    async with _agent(client, setup) as agent:
        session_id = await _open_session(client, agent)
        prompt = _prompt(agent, session_id)
        elicitation = await client.next_consented(within=30)
        async with ScriptedBrowser() as browser:
            final = await browser.authorize(elicitation.url)
            assert final.status_code == 200, final.text
            assert "You can close this tab" in final.text
        result = await asyncio.wait_for(prompt, 30)
        assert result.stop_reason == "end_turn"
    stderr = agent.stderr()

    # The wire: one URL-mode elicitation/create with the fields the protocol names...
    creates = client.received("elicitation/create")
    assert len(creates) == 1, stderr
    params = creates[0]["params"]
    assert params["mode"] == "url" and params["sessionId"] == session_id
    assert params["toolCallId"].startswith("call_")
    elicitation_id = params["elicitationId"]
    assert params["url"] == f"{setup.base_url}/connect/{elicitation_id}"
    assert elicitation.request_id == creates[0]["id"] and elicitation.flags == []
    assert [r.get("result") for r in client.responses_to(creates[0]["id"])] == [{"action": "accept"}]
    # ...exactly one elicitation/complete with the same id, on this connection...
    completes = client.received("elicitation/complete")
    assert [c["params"] for c in completes] == [{"elicitationId": elicitation_id}]
    assert client.completions == [elicitation_id] and client.ignored == []
    assert client.violations == []
    # ...and the session update listing the repositories, fetched server-side with the token.
    updates = [m["params"] for m in client.received("session/update") if m["params"]["sessionId"] == session_id]
    listing = [u for u in updates if u["update"]["sessionUpdate"] == "agent_message_chunk"]
    assert len(listing) == 1
    assert "octocat/hello-world" in listing[0]["update"]["content"]["text"]
    assert "octocat/spoon-knife" in listing[0]["update"]["content"]["text"]
    tool_updates = [u["update"] for u in updates if u["update"]["sessionUpdate"] == "tool_call_update"]
    assert tool_updates[-1]["status"] == "completed" and tool_updates[-1]["toolCallId"] == params["toolCallId"]
    assert provider.api_calls.count("/api/user/repos") == 1
    assert len(provider.issued_access_tokens) == 1

    # No issued secret on the wire or in the agent's logs (the env the test passed is not a surface).
    for secret in provider.secrets_issued():
        assert secret not in client.wire_text(), "a provider secret reached the ACP wire"
        assert secret not in stderr, "a provider secret reached the agent's stderr"


async def test_stdio_agent_session_cancel_withdraws_the_pending_elicitation(setup: Setup) -> None:
    client = ScriptedClient("hold")  # the user never answers
    async with _agent(client, setup) as agent:
        session_id = await _open_session(client, agent)
        prompt = _prompt(agent, session_id)
        elicitation = await client.next_elicitation(within=30)
        await agent.conn.cancel(session_id=session_id)
        result = await asyncio.wait_for(prompt, 30)
        assert result.stop_reason == "cancelled"
        await asyncio.wait_for(elicitation.answered.wait(), 10)
        # The agent withdrew its request with $/cancel_request; the client answered it with -32800.
        cancels = client.received("$/cancel_request")
        assert [c["params"] for c in cancels] == [{"requestId": elicitation.request_id}]
        assert elicitation.cancel_requested and elicitation.error_code == -32800
        assert client.received("elicitation/complete") == []
        tool_updates = [m["params"]["update"] for m in client.received("session/update")]
        assert tool_updates[-1] == {
            "sessionUpdate": "tool_call_update",
            "toolCallId": elicitation.tool_call_id,
            "status": "failed",
        }
        # The connection survives the cancelled turn: a new session still works.
        await asyncio.wait_for(agent.conn.new_session(cwd=str(REPO)), 10)
        assert agent.process.returncode is None
    assert setup.provider.issued_codes == []


async def test_stdio_agent_without_url_mode_sends_no_elicitation(setup: Setup) -> None:
    client = ScriptedClient("accept", capabilities={"elicitation": NO_ELICITATION})
    async with _agent(client, setup) as agent:
        session_id = await _open_session(client, agent)
        result = await asyncio.wait_for(_prompt(agent, session_id), 30)
        assert result.stop_reason == "end_turn"
    assert client.received("elicitation/create") == []
    text = json.dumps([m["params"] for m in client.received("session/update")])
    assert "does not support URL-mode elicitation" in text
    assert setup.provider.api_calls == []
