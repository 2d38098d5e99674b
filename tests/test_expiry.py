"""Expiry: the time of an elicitation runs from elicitation/create, and the sweeper ends it when it is up.

On the wire (a raw JSON-RPC client that never answers): the waiting call returns `expired`, the client receives
`$/cancel_request` for the create it never answered, and the link is refused afterwards. Also: an elicitation
expired after the client accepted ends its waiter the same way (nothing to cancel then).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from service import AuthorizationStatus, ElicitationStatus
from service.testing import ScriptedBrowser

from .acp_peers import RawClient, RecordingClient, connect, eventually, prompt_text, raw_peer
from .conftest import Deploy

FAST_SWEEP = {"CONNECTOR_ELICITATION__SWEEP_INTERVAL_SECONDS": "0.02"}
INITIALIZE = {"protocolVersion": 1, "clientCapabilities": {"elicitation": {"url": {}}}}


async def test_an_unanswered_elicitation_expires_and_its_create_is_cancelled(deploy_with: Deploy) -> None:
    async with deploy_with(**FAST_SWEEP) as deployment:
        connector = deployment.connector
        ttl = timedelta(seconds=connector.settings.elicitation.ttl_seconds)
        client = RawClient({"action": "accept"}, hold=True)  # the user never answers in the client
        async with raw_peer(connector, deployment.local_user, client, INITIALIZE) as agent:
            session = await client.new_session()
            prompt = asyncio.create_task(client.prompt(session))
            params = await client.next_create()
            elicitation_id = params["elicitationId"]
            record = await connector.elicitation(elicitation_id)
            assert record is not None and record.expires_at == record.created_at + ttl

            connector.clock.advance(ttl - timedelta(seconds=1))
            await connector.runtime.sweeper.sweep()
            still = await connector.elicitation(elicitation_id)
            assert still is not None and still.status is ElicitationStatus.PENDING  # not due yet

            connector.clock.advance(timedelta(seconds=1))  # due now: the sweeper ends it
            result = await asyncio.wait_for(prompt, 10)

            assert result == {"stopReason": "end_turn"}
            assert [o.status for o in agent.outcomes] == [AuthorizationStatus.EXPIRED]
            # The create request was never answered: the client is told to drop it, once.
            create_id = next(
                m["id"] for m in client.received("elicitation/create") if m["params"]["elicitationId"] == elicitation_id
            )
            assert [c["params"] for c in client.received("$/cancel_request")] == [{"requestId": create_id}]
            await eventually(lambda: _answered_cancelled(client, create_id), "the client answers the create -32800")

        expired = await connector.elicitation(elicitation_id)
        assert expired is not None and expired.status is ElicitationStatus.EXPIRED
        assert expired.failure_reason == "expired before completion"
        events = await connector.runtime.store.audit.list(elicitation_id=elicitation_id, event="expired")
        assert len(events) == 1 and events[0].identity == deployment.local_user
        logged = await connector.runtime.store.outbox.after(0)
        assert [(e.elicitation_id, e.status) for e in logged] == [(elicitation_id, ElicitationStatus.EXPIRED)]

        # A later answer is refused: the link says it expired, and nothing changes.
        async with ScriptedBrowser() as browser:
            page = await browser.get(params["url"])
        assert page.status_code == 410 and "expired" in page.text
        after = await connector.elicitation(elicitation_id)
        assert after is not None and after.status is ElicitationStatus.EXPIRED


async def test_an_accepted_elicitation_that_expires_releases_its_waiter(deploy_with: Deploy) -> None:
    async with deploy_with(**FAST_SWEEP) as deployment:
        connector = deployment.connector
        client = RecordingClient(answer="accept")
        wire = await connect(connector, deployment.local_user, client)
        prompt = asyncio.create_task(wire.client_conn.prompt(session_id="sess-1", prompt=prompt_text("repos")))
        await client.next_url()
        await eventually(lambda: _consented(connector, wire), "the client's accept is recorded")

        connector.clock.advance(timedelta(seconds=connector.settings.elicitation.ttl_seconds))
        result = await asyncio.wait_for(prompt, 10)

        assert result.stop_reason == "end_turn"
        assert [o.status for o in wire.agent.outcomes] == [AuthorizationStatus.EXPIRED]
        assert wire.received("$/cancel_request") == []  # the create was answered: nothing to withdraw
        assert wire.received("elicitation/complete") == []
        await wire.close()


async def _consented(connector, wire) -> bool:  # type: ignore[no-untyped-def]
    creates = wire.received("elicitation/create")
    if not creates:
        return False
    record = await connector.elicitation(creates[0]["params"]["elicitationId"])
    return record is not None and record.status is ElicitationStatus.CONSENTED


async def _answered_cancelled(client: RawClient, request_id: object) -> bool:
    return any(m.get("id") == request_id and m.get("error", {}).get("code") == -32800 for m in client.sent())
