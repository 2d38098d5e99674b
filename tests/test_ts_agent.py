"""The TypeScript example agent (`examples/ts_agent`, on the official `@agentclientprotocol/sdk` from npm) against a
real sidecar process: the official Python SDK client <-> the TS agent over stdio <-> the sidecar's /v1 API <-> the mock
provider over HTTP <-> a scripted browser. The agent receives exactly one completion and never a token."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from acp import text_block

from service.testing import MockOAuthProvider, ScriptedBrowser, ScriptedClient, spawn_agent
from service.testing.acp_client import NO_ELICITATION

from .sidecar_support import Sidecar, running_sidecar

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ts_agent"
REPOS = [{"id": 1, "full_name": "octocat/hello-world", "private": False}]


def build_example() -> Path:
    """`npm ci` and `tsc`, once per change of the lock file or the sources; the compiled agent's path."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("the TypeScript example needs Node.js 20+ and npm")
    stamp = EXAMPLE / ".installed"
    inputs = [EXAMPLE / "package-lock.json", EXAMPLE / "tsconfig.json", *sorted((EXAMPLE / "src").glob("*.ts"))]
    newest = max(path.stat().st_mtime for path in inputs)
    if not stamp.exists() or stamp.stat().st_mtime < newest or not (EXAMPLE / "dist" / "agent.js").exists():
        for command in (["npm", "ci", "--no-audit", "--no-fund"], ["npx", "tsc", "-p", "."]):
            subprocess.run(command, cwd=EXAMPLE, check=True, capture_output=True, timeout=300)
        stamp.touch()
    return EXAMPLE / "dist" / "agent.js"


def agent_env(sidecar: Sidecar) -> dict[str, str]:
    return {
        "SIDECAR_URL": sidecar.base_url,
        "SIDECAR_API_KEY": sidecar.api_key,
        "AGENT_USER_ISSUER": sidecar.local_user.issuer,
        "AGENT_USER_SUBJECT": sidecar.local_user.subject,
        "PATH": os.environ.get("PATH", ""),
    }


@pytest.mark.duration(8)
async def test_ts_agent_completes_a_flow_through_the_sidecar(tmp_path: Path) -> None:
    script = build_example()
    provider = MockOAuthProvider(repos=REPOS)
    async with running_sidecar(tmp_path, provider) as sidecar:
        client = ScriptedClient("accept")
        async with spawn_agent(client, "node", str(script), env=agent_env(sidecar), cwd=EXAMPLE) as agent:
            await asyncio.wait_for(client.initialize(agent.conn), 30)
            session = (await asyncio.wait_for(agent.conn.new_session(cwd=str(EXAMPLE)), 10)).session_id
            prompt = asyncio.create_task(
                agent.conn.prompt(session_id=session, prompt=[text_block("list my repositories")])
            )
            elicitation = await client.next_consented(within=30)
            async with ScriptedBrowser() as browser:
                final = await browser.authorize(elicitation.url)
                assert final.status_code == 200, final.text
            result = await asyncio.wait_for(prompt, 30)
            stderr = agent.stderr()
            assert result.stop_reason == "end_turn", stderr
        creates = client.received("elicitation/create")
        assert len(creates) == 1, stderr
        params = creates[0]["params"]
        eid = params["elicitationId"]
        assert params["mode"] == "url" and params["sessionId"] == session and params["toolCallId"] == "call_1"
        assert params["url"] == f"{sidecar.base_url}/connect/{eid}"
        # Exactly one completion, with the original id, on this connection.
        assert [c["params"] for c in client.received("elicitation/complete")] == [{"elicitationId": eid}]
        assert client.completions == [eid] and client.violations == [] and client.ignored == []
        text = json.dumps([m["params"] for m in client.received("session/update")])
        assert "octocat/hello-world" in text
        assert provider.api_calls.count("/api/user/repos") == 1  # through the proxy, with the token
        record = await sidecar.store.elicitations.get(eid)
        assert record is not None and record.status == "completed"
        for secret in provider.secrets_issued():
            assert secret not in client.wire_text() and secret not in stderr
            assert secret not in sidecar.log_text()


async def test_ts_agent_without_url_mode_sends_nothing(tmp_path: Path) -> None:
    script = build_example()
    provider = MockOAuthProvider(repos=REPOS)
    async with running_sidecar(tmp_path, provider) as sidecar:
        client = ScriptedClient("accept", capabilities={"elicitation": NO_ELICITATION})
        async with spawn_agent(client, "node", str(script), env=agent_env(sidecar), cwd=EXAMPLE) as agent:
            await asyncio.wait_for(client.initialize(agent.conn), 30)
            session = (await asyncio.wait_for(agent.conn.new_session(cwd=str(EXAMPLE)), 10)).session_id
            result = await asyncio.wait_for(
                agent.conn.prompt(session_id=session, prompt=[text_block("list my repositories")]), 30
            )
            assert result.stop_reason == "end_turn"
        assert client.received("elicitation/create") == []
        assert "URL-mode" in json.dumps([m["params"] for m in client.received("session/update")])
        assert provider.api_calls == []
