"""The TypeScript example agent (`examples/ts_agent`, on the official `@agentclientprotocol/sdk` from npm) against a
real sidecar process: the official Python SDK client <-> the TS agent over stdio <-> the sidecar's /v1 API <-> the mock
provider over HTTP <-> a scripted browser. The agent decides as `AcpAuthorizer` does (stored grants first, then URL
mode), sends exactly one completion for an authorized or narrowed elicitation, withdraws its create when the
elicitation ends first, reports a client that goes away as a disconnect, ends a tool call without a grant `failed`, and
never sees a token."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from acp import text_block

from service.testing import MockOAuthProvider, ScriptedBrowser, ScriptedClient, spawn_agent
from service.testing.acp_client import NO_ELICITATION, REQUEST_CANCELLED, SpawnedAgent

from .api_support import api_client, make_key
from .sidecar_support import Sidecar, running_sidecar
from .ts_support import EXAMPLE, built_example

pytestmark = pytest.mark.asyncio(loop_scope="module")

REPOS = [{"id": 1, "full_name": "octocat/hello-world", "private": False}]


@pytest.fixture(scope="module")
def agent_script() -> Path:
    """The compiled example agent (and the package it uses), built once per change."""
    return built_example()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Sidecar, MockOAuthProvider]]:
    """One sidecar process and mock provider for the module (starting a sidecar takes seconds)."""
    provider = MockOAuthProvider(repos=REPOS)
    async with running_sidecar(tmp_path_factory.mktemp("ts-agent"), provider) as sidecar:
        yield sidecar, provider


@pytest.fixture
def tenant() -> str:
    """This test's own tenant at the shared sidecar."""
    return f"ts-{uuid.uuid4().hex[:12]}"


@pytest_asyncio.fixture(loop_scope="module")
async def sidecar(shared: tuple[Sidecar, MockOAuthProvider], tenant: str) -> Sidecar:
    """The shared sidecar as a tenant of this test's own, its user without grants, its provider reset."""
    running, provider = shared
    provider.narrow_scopes = set()
    provider.api_calls.clear()
    for grant in await running.store.grants.find(running.local_user, "github"):
        await running.store.grants.delete(grant.id)
    key = await make_key(running.store, tenant=tenant)
    return dataclasses.replace(running, api_key=key)


@pytest.fixture
def provider(shared: tuple[Sidecar, MockOAuthProvider]) -> MockOAuthProvider:
    return shared[1]


@dataclasses.dataclass
class TsAgent:
    """The compiled example agent in a Node process, initialized by `client`, with one session."""

    client: ScriptedClient
    process: SpawnedAgent
    session_id: str

    def start_turn(self) -> asyncio.Task[Any]:
        """One turn ("list my repositories") under way; the task ends with the prompt's response."""
        ask = [text_block("list my repositories")]
        return asyncio.create_task(self.process.conn.prompt(session_id=self.session_id, prompt=ask))

    async def prompt(self, *, browser_authorizes: bool = False) -> str:
        """One turn, the browser authorizing when the client consents; its stop reason."""
        turn = self.start_turn()
        if browser_authorizes:
            elicitation = await self.client.next_consented(within=30)
            async with ScriptedBrowser() as browser:
                final = await browser.authorize(elicitation.url)
                assert final.status_code == 200, final.text
        return str((await asyncio.wait_for(turn, 30)).stop_reason)

    def stderr(self) -> str:
        return self.process.stderr()


@asynccontextmanager
async def ts_agent(script: Path, sidecar: Sidecar, client: ScriptedClient) -> AsyncIterator[TsAgent]:
    env = {
        "SIDECAR_URL": sidecar.base_url,
        "SIDECAR_API_KEY": sidecar.api_key,
        "AGENT_USER_ISSUER": sidecar.local_user.issuer,
        "AGENT_USER_SUBJECT": sidecar.local_user.subject,
        "PROVIDER": "github",
        "PATH": os.environ.get("PATH", ""),
    }
    async with spawn_agent(client, "node", str(script), env=env, cwd=EXAMPLE) as agent:
        await asyncio.wait_for(client.initialize(agent.conn), 30)
        session = (await asyncio.wait_for(agent.conn.new_session(cwd=str(EXAMPLE)), 10)).session_id
        yield TsAgent(client, agent, session)


async def sidecar_state(sidecar: Sidecar, elicitation_id: str, wait: float | None = None) -> dict[str, Any]:
    """The elicitation's state at the sidecar (with `wait`: once it has an outcome, or when the seconds are up)."""
    params = {"wait": str(wait)} if wait is not None else {}
    async with api_client(sidecar.base_url, sidecar.api_key) as api:
        answer = await api.get(f"/v1/elicitations/{elicitation_id}", params=params)
        assert answer.status_code == 200, answer.text
        return answer.json()  # type: ignore[no-any-return]


@pytest.mark.duration(8)
async def test_ts_agent_completes_a_flow_through_the_sidecar(
    agent_script: Path, sidecar: Sidecar, provider: MockOAuthProvider
) -> None:
    client = ScriptedClient("accept")
    async with ts_agent(agent_script, sidecar, client) as agent:
        assert await agent.prompt(browser_authorizes=True) == "end_turn", agent.stderr()
        stderr = agent.stderr()
    creates = client.received("elicitation/create")
    assert len(creates) == 1, stderr
    params = creates[0]["params"]
    eid = params["elicitationId"]
    assert params["mode"] == "url" and params["sessionId"] == agent.session_id and params["toolCallId"] == "call_1"
    assert params["url"] == f"{sidecar.base_url}/connect/{eid}"
    # Exactly one completion, with the original id, on this connection.
    assert [c["params"] for c in client.received("elicitation/complete")] == [{"elicitationId": eid}]
    assert client.completions == [eid] and client.violations == [] and client.ignored == []
    text = client.agent_text(agent.session_id)
    assert "octocat/hello-world" in text and "did not grant" not in text
    assert provider.api_calls.count("/api/user/repos") == 1  # through the proxy, with the token
    assert (await sidecar_state(sidecar, eid))["outcome"] == "authorized"
    for secret in provider.secrets_issued():
        assert secret not in client.wire_text() and secret not in stderr
        assert secret not in sidecar.log_text()


@pytest.mark.duration(8)
async def test_ts_agent_completes_a_narrowed_flow_once_and_does_not_ask_again(
    agent_script: Path, sidecar: Sidecar, provider: MockOAuthProvider
) -> None:
    provider.narrow_scopes = {"repo"}  # the user's consent leaves `repo` out
    client = ScriptedClient("accept")
    async with ts_agent(agent_script, sidecar, client) as agent:
        assert await agent.prompt(browser_authorizes=True) == "end_turn", agent.stderr()
        [create] = client.received("elicitation/create")
        eid = create["params"]["elicitationId"]
        state = await sidecar_state(sidecar, eid)
        assert state["outcome"] == "narrowed" and state["refusedScopes"] == ["repo"]
        # A narrowed elicitation completed: the client is told, once.
        assert [c["params"] for c in client.received("elicitation/complete")] == [{"elicitationId": eid}]
        assert "Mock Provider did not grant repo" in client.agent_text(agent.session_id)

        # The same scopes again: the stored narrowed grant answers, nobody is asked again (no prompt loop).
        assert await agent.prompt() == "end_turn", agent.stderr()
        stderr = agent.stderr()
    assert len(client.received("elicitation/create")) == 1, stderr
    assert client.completions == [eid] and client.violations == [] and client.ignored == []
    assert client.agent_text(agent.session_id).count("Mock Provider did not grant repo") == 2
    assert provider.api_calls.count("/api/user/repos") == 2  # the agent went on with what was granted


async def test_ts_agent_without_url_mode_sends_nothing(
    agent_script: Path, sidecar: Sidecar, provider: MockOAuthProvider, tenant: str
) -> None:
    client = ScriptedClient("accept", capabilities={"elicitation": NO_ELICITATION})
    async with ts_agent(agent_script, sidecar, client) as agent:
        assert await agent.prompt() == "end_turn", agent.stderr()
    assert client.received("elicitation/create") == [] and client.received("elicitation/complete") == []
    assert "URL-mode" in client.agent_text(agent.session_id)
    assert tool_call_updates(client, "call_1")[-1]["status"] == "failed"
    assert provider.api_calls == []
    # Recorded at the sidecar as the embedded connector records it (`urlMode: false`), nothing created.
    audited = await sidecar.store.audit.list(event="unsupported_client")
    assert [a.detail for a in audited if a.detail.get("tenant") == tenant] == [{"tenant": tenant, "via": "api"}]


async def test_ts_agent_without_url_mode_uses_a_narrowed_grant(
    agent_script: Path, sidecar: Sidecar, provider: MockOAuthProvider
) -> None:
    provider.narrow_scopes = {"repo"}
    holder = ScriptedClient("accept")
    async with ts_agent(agent_script, sidecar, holder) as agent:  # the user's narrowed grant, made on another client
        assert await agent.prompt(browser_authorizes=True) == "end_turn", agent.stderr()
    assert len(holder.completions) == 1

    client = ScriptedClient("accept", capabilities={"elicitation": NO_ELICITATION})
    async with ts_agent(agent_script, sidecar, client) as agent:
        assert await agent.prompt() == "end_turn", agent.stderr()
    # The grant settles it before URL mode matters: `narrowed`, and nothing is sent to this client.
    assert client.received("elicitation/create") == [] and client.received("elicitation/complete") == []
    text = client.agent_text(agent.session_id)
    assert "Mock Provider did not grant repo" in text and "octocat/hello-world" in text and "URL-mode" not in text
    assert client.violations == [] and client.ignored == []


def tool_call_updates(client: ScriptedClient, tool_call_id: str) -> list[dict[str, Any]]:
    """The `tool_call` / `tool_call_update`s for one tool call, as the client received them (raw JSON)."""
    updates = [m["params"]["update"] for m in client.received("session/update")]
    return [u for u in updates if u.get("toolCallId") == tool_call_id]


@pytest.mark.duration(8)
async def test_ts_agent_withdraws_its_create_when_the_browser_finishes_first(
    agent_script: Path, sidecar: Sidecar, provider: MockOAuthProvider
) -> None:
    client = ScriptedClient("hold")  # the client has not answered the create when the browser finishes
    async with ts_agent(agent_script, sidecar, client) as agent:
        turn = agent.start_turn()
        elicitation = await client.next_elicitation(within=30)
        # The user opened the link elsewhere (not through this client's consent): read it from the request itself.
        async with ScriptedBrowser() as browser:
            final = await browser.authorize(elicitation.raw_params["url"])
            assert final.status_code == 200, final.text
        assert str((await asyncio.wait_for(turn, 30)).stop_reason) == "end_turn", agent.stderr()
        stderr = agent.stderr()
    eid = elicitation.elicitation_id
    assert eid is not None
    # The agent withdrew exactly its create, then told the client once that the elicitation completed.
    cancels = client.received("$/cancel_request")
    assert [c["params"] for c in cancels] == [{"requestId": elicitation.request_id}], stderr
    assert elicitation.cancel_requested and elicitation.error_code == REQUEST_CANCELLED
    wire = [w.message.get("method") for w in client.transcript if w.direction == "in"]
    assert wire.index("$/cancel_request") < wire.index("elicitation/complete")
    assert [c["params"] for c in client.received("elicitation/complete")] == [{"elicitationId": eid}]
    assert client.completions == [eid] and client.violations == [] and client.ignored == []
    assert (await sidecar_state(sidecar, eid))["outcome"] == "authorized"
    assert tool_call_updates(client, "call_1")[-1]["status"] == "completed"
    assert provider.api_calls.count("/api/user/repos") == 1


@pytest.mark.duration(6)
async def test_ts_agent_reports_a_client_that_goes_away_mid_create_as_a_disconnect(
    agent_script: Path, sidecar: Sidecar
) -> None:
    client = ScriptedClient("hold")
    async with ts_agent(agent_script, sidecar, client) as agent:
        turn = agent.start_turn()
        elicitation = await client.next_elicitation(within=30)
    # Leaving the block closed the client's connection and the agent's stdin, the create still unanswered.
    turn.cancel()
    with suppress(BaseException):
        await turn
    assert elicitation.response is None and elicitation.elicitation_id is not None
    state = await sidecar_state(sidecar, elicitation.elicitation_id, wait=10)
    assert state["status"] == "cancelled", agent.stderr()
    assert state["outcome"] == "disconnected" and state["reason"] == "client_disconnected", state
    assert agent.process.process.returncode == 0, agent.stderr()  # it finished its work and exited on its own
    assert client.received("elicitation/complete") == []


async def test_ts_agent_ends_the_tool_call_failed_when_the_user_declines(
    agent_script: Path, sidecar: Sidecar, provider: MockOAuthProvider
) -> None:
    client = ScriptedClient("decline")
    async with ts_agent(agent_script, sidecar, client) as agent:
        assert await agent.prompt() == "end_turn", agent.stderr()
    [create] = client.received("elicitation/create")
    assert (await sidecar_state(sidecar, create["params"]["elicitationId"]))["outcome"] == "declined"
    updates = tool_call_updates(client, "call_1")
    assert updates[0]["sessionUpdate"] == "tool_call"
    last = updates[-1]
    assert last["sessionUpdate"] == "tool_call_update" and last["status"] == "failed", updates
    assert last["content"] == [
        {
            "type": "content",
            "content": {"type": "text", "text": "The user declined access to Mock Provider. (declined in the client)"},
        }
    ]
    assert "declined access to Mock Provider" in client.agent_text(agent.session_id)
    assert client.received("elicitation/complete") == [] and provider.api_calls == []


@pytest.mark.duration(6)
async def test_ts_agent_session_cancel_withdraws_its_create_and_says_why(
    agent_script: Path, sidecar: Sidecar, tenant: str
) -> None:
    client = ScriptedClient("hold")
    async with ts_agent(agent_script, sidecar, client) as agent:
        turn = agent.start_turn()
        elicitation = await client.next_elicitation(within=30)
        await agent.process.conn.cancel(session_id=agent.session_id)
        assert str((await asyncio.wait_for(turn, 30)).stop_reason) == "cancelled", agent.stderr()
    eid = elicitation.elicitation_id
    assert eid is not None
    assert [c["params"] for c in client.received("$/cancel_request")] == [{"requestId": elicitation.request_id}]
    state = await sidecar_state(sidecar, eid, wait=10)
    assert state["outcome"] == "cancelled" and state["reason"] == "the client cancelled the session's work", state
    [audited] = await sidecar.store.audit.list(elicitation_id=eid, event="cancelled")
    assert {k: audited.detail.get(k) for k in ("cause", "request_cancelled")} == {
        "cause": "session_cancel",
        "request_cancelled": True,
    }
    assert tool_call_updates(client, "call_1")[-1]["status"] == "failed"
    assert client.received("elicitation/complete") == []


@pytest.mark.duration(6)
async def test_ts_agent_reports_a_client_that_goes_away_in_the_browser_phase_as_a_disconnect(
    agent_script: Path, sidecar: Sidecar
) -> None:
    client = ScriptedClient("accept")  # the user consents but never finishes in the browser
    async with ts_agent(agent_script, sidecar, client) as agent:
        turn = agent.start_turn()
        eid = (await client.next_consented(within=30)).elicitation_id
        assert eid is not None
        async with api_client(sidecar.base_url, sidecar.api_key) as api:
            for _ in range(100):  # until the agent has reported the accept
                if (await api.get(f"/v1/elicitations/{eid}")).json()["status"] == "consented":
                    break
                await asyncio.sleep(0.05)
    turn.cancel()
    with suppress(BaseException):
        await turn
    state = await sidecar_state(sidecar, eid, wait=10)
    assert state["outcome"] == "disconnected" and state["reason"] == "client_disconnected", state
    assert agent.process.process.returncode == 0, agent.stderr()
    assert client.received("elicitation/complete") == [] and client.received("$/cancel_request") == []


@pytest.mark.duration(6)
async def test_ts_agent_stops_when_the_client_cancels_the_prompt_request(agent_script: Path, sidecar: Sidecar) -> None:
    client = ScriptedClient("hold")
    async with ts_agent(agent_script, sidecar, client) as agent:
        turn = agent.start_turn()
        elicitation = await client.next_elicitation(within=30)
        await client.cancel_request(client.sent("session/prompt")[-1]["id"])
        with suppress(Exception):  # the prompt answers "cancelled" or with -32800, as the SDK decides
            await asyncio.wait_for(turn, 30)
        eid = elicitation.elicitation_id
        assert eid is not None
        state = await sidecar_state(sidecar, eid, wait=10)
        stderr = agent.stderr()
    assert [c["params"] for c in client.received("$/cancel_request")] == [{"requestId": elicitation.request_id}]
    assert state["outcome"] == "cancelled", stderr
    assert state["reason"] == "the client cancelled the request being served", state
    assert client.received("elicitation/complete") == []
