"""Nothing is kept for a finished flow: after the whole flows of many users (each using its grant once), the tables
kept per user and per grant hold no more than their bounds, and those kept per flow or per lookup hold nothing."""

from __future__ import annotations

import asyncio

import pytest

from service import AuthorizationStatus, Identity
from service.testing import ScriptedBrowser

from .acp_peers import RecordingClient, connect, prompt_text
from .conftest import ALICE, Deploy

USERS = 12
KEPT = 4  # the bound the test gives the per-grant tables (10,000 in a deployment)
PROXY = {  # the test's loopback peer plays an authenticating proxy that names each user
    "CONNECTOR_IDENTITY__VERIFIER": "trusted_header",
    "CONNECTOR_IDENTITY__TRUSTED_HEADER__ISSUER": ALICE.issuer,
    "CONNECTOR_SERVER__TRUSTED_PROXIES": "127.0.0.1/32",
}


async def test_flows_of_many_users_leave_the_per_flow_tables_empty_and_the_per_grant_ones_bounded(
    deploy_with: Deploy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("service.tokens.access.GRANTS_KEPT", KEPT)
    monkeypatch.setattr("service.tokens.access.GRANT_LOOKUPS_KEPT", KEPT)
    async with deploy_with(ALICE, **PROXY) as deployment:
        connector = deployment.connector
        for n in range(USERS):
            user = Identity(ALICE.issuer, f"user-{n}")
            client = RecordingClient(answer="accept")
            wire = await connect(connector, user, client)  # its agent uses the grant once the flow is done
            prompt = asyncio.create_task(wire.client_conn.prompt(session_id="sess-1", prompt=prompt_text("go")))
            async with ScriptedBrowser(headers={"X-Forwarded-User": user.subject}) as browser:
                page = await browser.get(await client.next_url())
                final = await browser.follow(await browser.submit(page, "continue"))
                assert final.status_code == 200, final.text
            assert (await asyncio.wait_for(prompt, 10)).stop_reason == "end_turn"
            assert [o.status for o in wire.agent.outcomes] == [AuthorizationStatus.AUTHORIZED]
            await wire.close()

        runtime = connector.runtime
        assert runtime.tokens.tables() == {
            "grant_lookups": KEPT,  # the most recent users' lookups, token sets and uses; the rest read again
            "reading": 0,
            "token_sets": KEPT,
            "dpop_keys": 0,
            "grants_used": KEPT,
            "locks": 0,
        }
        assert runtime.bus.waiting() == 0
        assert runtime.acp.tables() == {"links": 0, "deliveries": 0, "blocked_sessions": 0, "state_listeners": 0}
