"""The early-stop table (`cancellation_table.py`) over the in-memory transport, with the SDK's client."""

from __future__ import annotations

import pytest

from service import ElicitationStatus

from .acp_peers import ConnectorAgent, scripted_peer
from .cancellation_table import TABLE, Row, client_for, run_row
from .conftest import Deploy


@pytest.mark.parametrize("row", TABLE, ids=[row.id for row in TABLE])
async def test_early_stop_on_the_wire(deploy_with: Deploy, row: Row) -> None:
    overrides = {"CONNECTOR_ELICITATION__TTL_SECONDS": str(row.ttl)} if row.ttl is not None else {}
    async with deploy_with(**overrides) as deployment:
        connector = deployment.connector
        agent = ConnectorAgent(connector, deployment.local_user)
        agent.timeout = row.agent_timeout
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
