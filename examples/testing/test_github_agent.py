"""Testing an agent with the connector's pytest plugin: the GitHub example agent, end to end.

Everything here comes from the plugin (the `testing` extra; README.md beside this file installs it): a mock OAuth
provider on loopback, the connector environment bound to it, a scripted ACP client on the official SDK, and a scripted
browser. The agent runs as its own process over stdio, exactly as an editor would start it.

    make testing-kit
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from acp import text_block

from service.testing import MockOAuthProvider, ScriptedBrowser, ScriptedClient, spawn_agent

pytestmark = pytest.mark.asyncio  # (not needed with asyncio_mode = "auto")

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]  # where `python -m examples.github_agent` finds the agent
AGENT = [sys.executable, "-m", "examples.github_agent"]


async def ask_for_repositories(client: ScriptedClient, agent_env: dict[str, str], browser: ScriptedBrowser) -> str:
    """Start the agent, prompt it once, act as the user in the browser; what the agent answered."""
    async with spawn_agent(client, *AGENT, env=agent_env, cwd=REPOSITORY_ROOT) as agent:
        await client.initialize(agent.conn)
        session = await agent.conn.new_session(cwd=str(REPOSITORY_ROOT))
        turn = asyncio.create_task(
            agent.conn.prompt(session_id=session.session_id, prompt=[text_block("List my repositories")])
        )
        waiting = asyncio.create_task(client.next_consented_url(within=30))
        done, _ = await asyncio.wait({turn, waiting}, return_when=asyncio.FIRST_COMPLETED)
        if waiting in done:  # the agent asked for access: the user goes through the connect page
            await browser.authorize(waiting.result())
        else:
            waiting.cancel()
        result = await asyncio.wait_for(turn, 30)
        assert result.stop_reason == "end_turn", agent.stderr()
        return client.agent_text(session.session_id)


@pytest.mark.oauth_provider(repos=[{"id": 7, "full_name": "test-user/plugin-demo", "private": False}])
async def test_the_agent_lists_repositories_once_the_user_connects(
    oauth_provider: MockOAuthProvider,
    agent_env: dict[str, str],
    scripted_client: ScriptedClient,
    scripted_browser: ScriptedBrowser,
) -> None:
    text = await ask_for_repositories(scripted_client, agent_env, scripted_browser)
    assert "test-user/plugin-demo" in text
    # One URL-mode elicitation, completed once; the token never crossed ACP.
    (created,) = scripted_client.received("elicitation/create")
    assert created["params"]["mode"] == "url"
    assert len(scripted_client.received("elicitation/complete")) == 1
    assert scripted_client.violations == []
    assert not any(secret in scripted_client.wire_text() for secret in oauth_provider.secrets_issued())


@pytest.mark.oauth_provider(token_errors=["temporarily_unavailable"])
async def test_the_agent_says_so_when_the_provider_fails(
    agent_env: dict[str, str], scripted_client: ScriptedClient, scripted_browser: ScriptedBrowser
) -> None:
    text = await ask_for_repositories(scripted_client, agent_env, scripted_browser)
    assert "Authorization with Mock Provider failed" in text  # the agent explains instead of listing
    assert scripted_client.received("elicitation/complete") == []
