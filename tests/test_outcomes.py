"""Every answer the client or the browser can give ends in a distinct outcome; the wire shows only what it should."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from acp.exceptions import RequestError
from acp.schema import ClientCapabilities, ElicitationCapabilities, ElicitationFormCapabilities

from service import AuthorizationStatus, ElicitationStatus, SessionScope
from service.testing import ScriptedBrowser

from .acp_peers import RecordingClient, connect, eventually, prompt_text, status_is
from .conftest import Deploy, Deployment


async def run_prompt(deployment: Deployment, client: RecordingClient, **connect_kwargs: Any):  # type: ignore[no-untyped-def]
    wire = await connect(deployment.connector, deployment.local_user, client, **connect_kwargs)
    await asyncio.wait_for(wire.client_conn.prompt(session_id="sess-1", prompt=prompt_text("go")), 10)
    return wire


@pytest.mark.parametrize(
    "capabilities",
    [
        None,
        ClientCapabilities(),
        ClientCapabilities(elicitation=ElicitationCapabilities()),
        ClientCapabilities(elicitation=ElicitationCapabilities(form=ElicitationFormCapabilities())),
    ],
    ids=["no-capabilities", "no-elicitation", "empty-elicitation", "form-only"],
)
async def test_client_without_url_mode_gets_nothing_and_agent_gets_unsupported(
    deployment: Deployment, capabilities: ClientCapabilities | None
) -> None:
    client = RecordingClient()
    wire = await run_prompt(deployment, client, capabilities=capabilities)
    assert wire.received("elicitation/create") == []  # never sent, and never falls back to form mode
    outcome = wire.agent.outcomes[0]
    assert outcome.status is AuthorizationStatus.UNSUPPORTED
    assert "does not support URL-mode elicitation" in outcome.describe()
    await wire.close()


@pytest.mark.parametrize(
    ("answer", "status", "stored"),
    [
        ("decline", AuthorizationStatus.DECLINED, ElicitationStatus.DECLINED),
        ("cancel", AuthorizationStatus.CANCELLED, ElicitationStatus.CANCELLED),
    ],
)
async def test_decline_and_cancel_in_the_client(
    deployment: Deployment, answer: str, status: AuthorizationStatus, stored: ElicitationStatus
) -> None:
    wire = await run_prompt(deployment, RecordingClient(answer=answer))
    outcome = wire.agent.outcomes[0]
    assert outcome.status is status
    record = await deployment.connector.elicitation(outcome.elicitation_id or "")
    assert record is not None and record.status is stored
    assert wire.received("elicitation/complete") == []
    assert await deployment.connector.runtime.store.grants.find(deployment.local_user, "github") == []
    await wire.close()


@pytest.mark.parametrize("code", [-32602, -32603, -32601])
async def test_json_rpc_error_from_the_client(deployment: Deployment, code: int) -> None:
    def refuse() -> Any:
        raise RequestError(code, "refused")

    wire = await run_prompt(deployment, RecordingClient(answer=refuse))
    outcome = wire.agent.outcomes[0]
    assert outcome.status is AuthorizationStatus.CLIENT_ERROR and outcome.error_code == code
    record = await deployment.connector.elicitation(outcome.elicitation_id or "")
    assert record is not None and record.status is ElicitationStatus.FAILED
    await wire.close()


async def test_existing_grant_returns_at_once_without_elicitation(deployment: Deployment) -> None:
    client = RecordingClient(answer="accept")
    wire = await connect(deployment.connector, deployment.local_user, client)
    prompt = asyncio.create_task(wire.client_conn.prompt(session_id="sess-1", prompt=prompt_text("go")))
    async with ScriptedBrowser() as browser:
        assert (await browser.authorize(await client.next_url())).status_code == 200
    await asyncio.wait_for(prompt, 10)
    await asyncio.wait_for(wire.client_conn.prompt(session_id="sess-1", prompt=prompt_text("again")), 10)
    assert [o.status for o in wire.agent.outcomes] == [
        AuthorizationStatus.AUTHORIZED,
        AuthorizationStatus.ALREADY_AUTHORIZED,
    ]
    assert len(wire.received("elicitation/create")) == 1
    assert len(deployment.provider.token_requests) == 1
    await wire.close()


async def test_declining_on_the_consent_page(deployment: Deployment) -> None:
    client = RecordingClient(answer="accept")
    wire = await connect(deployment.connector, deployment.local_user, client)
    prompt = asyncio.create_task(wire.client_conn.prompt(session_id="sess-1", prompt=prompt_text("go")))
    url = await client.next_url()
    async with ScriptedBrowser() as browser:
        page = await browser.get(url)
        declined = await browser.submit(page, "decline")
        assert declined.status_code == 200 and "You declined" in declined.text
        again = await browser.get(url)
        assert again.status_code == 410 and again.headers["x-connector-error"] == "declined"
    await asyncio.wait_for(prompt, 10)
    assert wire.agent.outcomes[0].status is AuthorizationStatus.DECLINED
    assert wire.received("elicitation/complete") == []
    await wire.close()


async def test_access_denied_at_the_provider_is_a_decline(deployment: Deployment) -> None:
    deployment.provider.deny_next = "access_denied"
    client = RecordingClient(answer="accept")
    wire = await connect(deployment.connector, deployment.local_user, client)
    prompt = asyncio.create_task(wire.client_conn.prompt(session_id="sess-1", prompt=prompt_text("go")))
    async with ScriptedBrowser() as browser:
        final = await browser.authorize(await client.next_url())
        assert final.status_code == 400 and final.headers["x-connector-error"] == "access_denied"
    await asyncio.wait_for(prompt, 10)
    outcome = wire.agent.outcomes[0]
    assert outcome.status is AuthorizationStatus.DECLINED and "access_denied" in (outcome.reason or "")
    events = [
        e.event for e in await deployment.connector.runtime.store.audit.list(elicitation_id=outcome.elicitation_id)
    ]
    assert "provider_error" in events
    assert await deployment.connector.runtime.store.grants.find(deployment.local_user, "github") == []
    await wire.close()


async def test_elicitation_expires_while_waiting(deploy_with: Deploy) -> None:
    # The sweeper expires it (by default it looks every 5 s).
    sweep = {"CONNECTOR_ELICITATION__SWEEP_INTERVAL_SECONDS": "0.05"}
    async with deploy_with(CONNECTOR_ELICITATION__TTL_SECONDS="1", **sweep) as deployment:
        client = RecordingClient(answer="accept")
        wire = await run_prompt(deployment, client)
        outcome = wire.agent.outcomes[0]
        assert outcome.status is AuthorizationStatus.EXPIRED
        async with ScriptedBrowser() as browser:
            page = await browser.get(str(client.elicitations[0]["mode"].url))
            assert page.status_code == 410 and page.headers["x-connector-error"] == "expired"
        await wire.close()


async def test_dropped_connection_ends_the_elicitation_but_keeps_a_grant_already_underway(
    deployment: Deployment,
) -> None:
    connector = deployment.connector
    client = RecordingClient(answer="accept")
    wire = await connect(connector, deployment.local_user, client)
    assert wire.agent.conn is not None
    request = asyncio.create_task(
        connector.request_authorization(
            wire.agent.conn,
            wire.agent.capabilities,
            user=deployment.local_user,
            provider="github",
            scopes=["repo"],
            scope=SessionScope("sess-1"),
        )
    )
    url = await client.next_url()
    elicitation_id = wire.received("elicitation/create")[0]["params"]["elicitationId"]
    await eventually(lambda: status_is(connector, elicitation_id, ElicitationStatus.CONSENTED), "the accept arrives")
    async with ScriptedBrowser() as browser:
        page = await browser.get(url)
        to_provider = await browser.submit(page, "continue")  # the user is at the provider ...
        await wire.client_conn.close()  # ... when the client goes away
        outcome = await asyncio.wait_for(request, 10)
        assert outcome.status is AuthorizationStatus.DISCONNECTED and outcome.reason == "client_disconnected"
        record = await connector.elicitation(elicitation_id)
        assert record is not None and record.status is ElicitationStatus.CANCELLED
        assert record.failure_reason == "client_disconnected"
        assert (await browser.get(url)).headers["x-connector-error"] == "cancelled"  # nobody waits for a new start
        final = await browser.follow(to_provider)  # ... but the flow already underway stores its grant
    assert final.status_code == 200
    events = [e.event for e in await connector.runtime.store.audit.list(elicitation_id=elicitation_id)]
    assert "client_disconnected" in events and "completed_after_cancel" in events
    assert "completion_sent" not in events and client.completions == []
    assert len(await connector.runtime.store.grants.find(deployment.local_user, "github")) == 1
    await wire.agent_conn.close()


async def test_unknown_and_completed_links(deployment: Deployment) -> None:
    client = RecordingClient(answer="accept")
    wire = await connect(deployment.connector, deployment.local_user, client)
    prompt = asyncio.create_task(wire.client_conn.prompt(session_id="sess-1", prompt=prompt_text("go")))
    url = await client.next_url()
    async with ScriptedBrowser() as browser:
        unknown = await browser.get(f"{deployment.base_url}/connect/not-a-real-id")
        assert unknown.status_code == 404 and unknown.headers["x-connector-error"] == "unknown_elicitation"
        assert (await browser.authorize(url)).status_code == 200
        again = await browser.get(url)
        assert again.status_code == 409 and again.headers["x-connector-error"] == "already_completed"
    await asyncio.wait_for(prompt, 10)
    await wire.close()
