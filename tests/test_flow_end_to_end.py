"""The whole flow over a real ACP connection, a real loopback server and a mock provider."""

from __future__ import annotations

import asyncio
import json

import pytest

from service import AuthorizationStatus, ElicitationStatus
from service.core.handles import grant_aad
from service.testing import ScriptedBrowser

from .acp_peers import RecordingClient, connect, prompt_text
from .conftest import Deployment


async def test_github_flow_completes_and_token_stays_server_side(
    deployment: Deployment, captured_logs: pytest.LogCaptureFixture
) -> None:
    connector, provider = deployment.connector, deployment.provider
    user = deployment.local_user
    client = RecordingClient(answer="accept")
    bystander = RecordingClient(answer="accept")
    wire = await connect(connector, user, client)
    other = await connect(connector, user, bystander)  # a second client connected to the same agent

    prompt = asyncio.create_task(wire.client_conn.prompt(session_id="sess-1", prompt=prompt_text("list my repos")))
    connect_url = await asyncio.wait_for(client.urls.get(), 10)

    async with ScriptedBrowser() as browser:
        page = await browser.get(connect_url)
        assert page.status_code == 200
        assert "Test Agent" in page.text and "Mock Provider" in page.text
        assert provider.host in page.text and "<code>repo</code>" in page.text
        final = await browser.follow(await browser.submit(page, "continue"))
        assert final.status_code == 200, final.text
        assert "You can close this tab" in final.text
        transcript = browser.transcript(host="127.0.0.1")

    result = await asyncio.wait_for(prompt, 10)
    assert result.stop_reason == "end_turn"

    # The wire: one URL-mode elicitation/create with the fields the protocol names, then one complete.
    creates = wire.received("elicitation/create")
    assert len(creates) == 1
    params = creates[0]["params"]
    assert params["mode"] == "url"
    assert params["sessionId"] == "sess-1" and params["toolCallId"] == "call-1"
    elicitation_id = params["elicitationId"]
    assert params["url"] == f"{deployment.base_url}/connect/{elicitation_id}"
    assert len(elicitation_id) >= 22  # >= 128 bits of base64url randomness
    assert set(params) == {"sessionId", "toolCallId", "mode", "elicitationId", "url", "message"}

    completes = wire.received("elicitation/complete")
    assert [c["params"] for c in completes] == [{"elicitationId": elicitation_id}]
    assert client.completions == [elicitation_id]
    assert other.received("elicitation/complete") == [] and bystander.completions == []

    # The agent saw the outcome and used the token server-side (the mock API checked the bearer token).
    outcome = wire.agent.outcomes[0]
    assert outcome.status is AuthorizationStatus.AUTHORIZED and outcome.elicitation_id == elicitation_id
    assert provider.api_calls.count("/api/user/repos") == 1
    assert "octocat/hello-world" in json.dumps([u.model_dump(mode="json") for u in client.updates])

    # The database holds the grant encrypted, bound to the user and the provider account.
    store = connector.runtime.store
    record = await store.elicitations.get(elicitation_id)
    assert record is not None and record.status is ElicitationStatus.COMPLETED
    grants = await store.grants.find(user, "github")
    assert len(grants) == 1 and grants[0].provider_account_id == "4242"
    assert set(grants[0].scopes) == {"repo"}
    access_token = provider.issued_access_tokens[0]
    assert access_token.encode() not in grants[0].token_ciphertext
    aad = grant_aad(user.issuer, user.subject, "github", "4242")
    stored = connector.runtime.vault.decrypt_json(grants[0].token_key_id, grants[0].token_ciphertext, aad=aad)
    assert stored["access_token"] == access_token
    assert stored["refresh_token"] == provider.issued_refresh_tokens[0]
    events = [e.event for e in await store.audit.list(elicitation_id=elicitation_id)]
    assert events[:2] == ["created", "consented"] and "verified" in events and "completed" in events

    # No secret anywhere: ACP messages, browser-visible responses, logs, audit details.
    flows = await store.flows.get_by_state_hash(await _only_flow_hash(connector, elicitation_id))
    assert flows is not None
    audit_text = json.dumps([(e.event, e.detail) for e in await store.audit.list()], default=str)
    surfaces = {
        "acp": json.dumps(wire.messages + other.messages, default=str),
        "browser": transcript,
        "logs": connector_log_text(captured_logs),
        "audit": audit_text,
    }
    for secret in provider.secrets_issued():
        for name, text in surfaces.items():
            assert secret not in text, f"a provider secret leaked into {name}"
    await wire.close()
    await other.close()


def connector_log_text(caplog: pytest.LogCaptureFixture) -> str:
    """Every captured log line except httpx's lines about the test browser's own callback request.

    The scripted browser is an httpx client in this process: httpx logs the URL the provider redirected it
    to, which carries the code by design. No connector request goes to /callback/.
    """
    return "\n".join(
        r.getMessage() for r in caplog.records if not (r.name == "httpx" and "/callback/" in r.getMessage())
    )


async def _only_flow_hash(connector, elicitation_id: str) -> str:  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    from service.store.tables import oauth_flows

    async with connector.runtime.store.engine.connect() as conn:
        rows = (
            await conn.execute(select(oauth_flows.c.state_hash).where(oauth_flows.c.elicitation_id == elicitation_id))
        ).all()
    assert len(rows) == 1
    return str(rows[0][0])
