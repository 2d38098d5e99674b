"""The early-stop table (`cancellation_table.py`) over the in-memory transport, with the SDK's client."""

from __future__ import annotations

import asyncio

import pytest

from service import ElicitationStatus
from service.testing import ScriptedClient

from .acp_peers import ConnectorAgent, scripted_peer
from .cancellation_table import TABLE, Row, client_for, run_row, wire_events
from .conftest import Deploy, Deployment


@pytest.mark.parametrize("row", TABLE, ids=[row.id for row in TABLE])
async def test_early_stop_on_the_wire(deploy_with: Deploy, row: Row) -> None:
    async with deploy_with(**row.settings) as deployment:
        connector = deployment.connector
        agent = ConnectorAgent(connector, deployment.local_user)
        agent.deadline = row.agent_deadline
        client = client_for(row)

        async def status_of(elicitation_id: str) -> ElicitationStatus | None:
            record = await connector.elicitation(elicitation_id)
            return record.status if record is not None else None

        async with scripted_peer(connector, deployment.local_user, client, agent) as wire:
            await run_row(row, client, wire.conn, wire.session_id, status_of)
        expected_stops = {"agent_timeout": ["timeout"], "task_cancel": ["cancelled"]}.get(row.stop, [])
        assert agent.stops == expected_stops
        assert not any(outcome.ok for outcome in agent.outcomes)  # the work never went on as though authorized
        assert connector.runtime.acp.tables()["blocked_sessions"] == 0


async def test_the_agents_wait_for_timeout_withdraws_the_create(deployment: Deployment) -> None:
    """`asyncio.wait_for` around `request_authorization` (its own task, on Python 3.11): the same as the table's
    agent_timeout row during the create."""
    client = ScriptedClient("hold", protocol_version=2)
    agent = ConnectorAgent(deployment.connector, deployment.local_user)
    agent.timeout = 1.0
    async with scripted_peer(deployment.connector, deployment.local_user, client, agent) as wire:
        result = await asyncio.wait_for(wire.prompt(), 30)
        assert result.stop_reason == "end_turn" and agent.stops == ["timeout"]
        await wire.conn.new_session(cwd="/")  # a round trip
    (elicitation,) = client.elicitations
    assert wire_events(client) == [
        ("state", "requires_action"),
        ("create", elicitation.request_id),
        ("cancel_request", elicitation.request_id),
        ("state", "running"),
    ]
    record = await deployment.connector.elicitation(elicitation.elicitation_id or "")
    assert record is not None and record.status is ElicitationStatus.CANCELLED
